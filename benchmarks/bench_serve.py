"""Load test of `ensemble-llm serve`: concurrent OpenAI clients against one server.

    python benchmarks/bench_serve.py [--tokens 24] [--dtype float32] [--methods single,gac]

For each setup (Single over Qwen2.5-Coder-0.5B; GaC over Qwen + SmolLM2), in one process on
the same loaded weights, through the real `openai` client over HTTP, greedy:
* 16 requests one at a time (the reference texts, and the sequential tokens/s);
* 8 requests at once: aggregate tokens/s (goal: >= 3x one at a time);
* 16 requests at once (max_batch 8: eight generate, eight wait and join as places free up):
  errors, p50/p95 latency, and how many texts differ from the same request alone
  (float32: none may; in bf16 batched forwards round differently).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN, SMOL = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
TOPICS = [
    "list comprehensions", "generators", "decorators", "context managers", "type hints", "dataclasses",
    "the GIL", "asyncio", "closures", "f-strings", "slicing", "exceptions", "modules", "iterators",
    "lambda functions", "recursion",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--methods", default="single,gac")
    args = parser.parse_args()

    from openai import OpenAI
    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.serving.app import ServeSettings, create_app
    from ensemble_core.serving.background import serving_in_thread

    hf_logging.disable_progress_bar()
    loaded = {name: HFMember.from_pretrained(name, device="cpu", dtype=args.dtype) for name in (QWEN, SMOL)}
    setups = {"single": ([loaded[QWEN]], "single"), "gac": ([loaded[QWEN], loaded[SMOL]], "gac")}
    rows = []
    for key in args.methods.split(","):
        members, method = setups[key]
        ensemble = Ensemble([HFMember(m.model, m.tokenizer, name=m.name) for m in members], method=method)
        app = create_app(ensemble, ServeSettings(model_id=key, max_batch=8))
        with serving_in_thread(app) as base_url:
            openai = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=3600)

            def ask(topic: str, model: str = key, api: OpenAI = openai) -> tuple[str, int, float]:
                started = time.perf_counter()
                reply = api.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"Explain {topic} in Python in two sentences."}],
                    max_tokens=args.tokens,
                    temperature=0,
                )
                return reply.choices[0].message.content, reply.usage.completion_tokens, time.perf_counter() - started

            ask(TOPICS[0])  # warm-up
            started = time.perf_counter()
            alone = [ask(topic) for topic in TOPICS]
            sequential = sum(tokens for _, tokens, _ in alone) / (time.perf_counter() - started)
            at_once8, seconds8, errors8 = _concurrently(ask, TOPICS[:8])
            at_once16, _, errors16 = _concurrently(ask, TOPICS)
            aggregate8 = sum(tokens for _, tokens, _ in at_once8.values()) / seconds8
            latencies = sorted(latency for _, _, latency in at_once16.values())
            differ = sum(at_once16[i][0] != alone[i][0] for i in at_once16)
            rows.append(
                (
                    key,
                    sequential,
                    aggregate8,
                    aggregate8 / sequential,
                    statistics.median(latencies),
                    latencies[int(0.95 * (len(latencies) - 1))],
                    errors8 + errors16,
                    differ,
                    app.state.batcher.steps,
                )
            )
        ensemble.close()
    print(f"\n{args.tokens} tokens per request, {args.dtype}, greedy, max_batch 8, real openai client over HTTP")
    print(
        "| setup | 1 at a time tok/s | 8 at once tok/s | ratio (goal >= 3) | p50 s (16 at once) | p95 s | errors "
        "| texts differing from alone (of 16) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, seq, agg, ratio, p50, p95, errors, differ, _ in rows:
        print(f"| {key} | {seq:.2f} | {agg:.2f} | {ratio:.2f}x | {p50:.1f} | {p95:.1f} | {errors} | {differ} |")


def _concurrently(ask, topics: list[str]) -> tuple[dict[int, tuple[str, int, float]], float, int]:
    found: dict[int, tuple[str, int, float]] = {}
    errors = []

    def one(index: int) -> None:
        try:
            found[index] = ask(topics[index])
        except Exception as error:  # counted and shown: a load test reports failures, it does not stop
            errors.append(error)
            print(f"request {index} failed: {error}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(topics))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found, time.perf_counter() - started, len(errors)


if __name__ == "__main__":
    main()
