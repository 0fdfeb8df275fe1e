# The two commands of the README. Each sets up (or reuses) .venv, then runs.
.PHONY: demo test lint bench

export HF_HUB_OFFLINE := 1

demo:
	bash scripts/setup.sh
	.venv/bin/python examples/demo.py
	.venv/bin/python examples/langchain_chain.py
	.venv/bin/python examples/langchain_rag.py

test:
	bash scripts/setup.sh --test
	.venv/bin/ruff check core langchain_ensemble llamaindex_ensemble tests benchmarks examples scripts
	.venv/bin/python -m pytest -q -n auto --dist loadgroup --durations=25

bench:
	bash scripts/setup.sh
	.venv/bin/python benchmarks/bench_decode.py
