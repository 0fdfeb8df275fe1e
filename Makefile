# The two commands of the README. Each sets up (or reuses) .venv, then runs.
.PHONY: demo test docs package bench

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

# The docs site (mkdocs-material): strict, so a broken link or a page outside the nav fails.
docs:
	bash scripts/setup.sh
	.venv/bin/mkdocs build --strict --site-dir site

# The wheel and sdist as a release builds them, installed into a fresh virtualenv as a user would.
package:
	bash scripts/setup.sh
	bash scripts/check_package.sh
