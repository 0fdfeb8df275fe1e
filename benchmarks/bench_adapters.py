"""What the framework adapters cost on top of the core: the same generation, seven ways.

One loaded ensemble (Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE) answers one chat prompt
greedily (same tokens every time) through `Ensemble.generate` (in this thread and in an
executor thread), `ChatEnsemble.invoke`, `ChatEnsemble.stream`, `ChatEnsemble.ainvoke` and
LlamaIndex's `EnsembleLLM.chat` / `astream_chat`. The calls are interleaved for several rounds
and the median of each is reported with its ratio to the core, all measured in the same run.

Also: 8 concurrent `ainvoke` calls vs 8 sequential `invoke` calls (they queue on the
ensemble, so the ratio shows the cost of the queueing, not a speed-up), and how long the
event loop stays free while they run (the longest gap between ticks of a 5 ms ticker).

    python benchmarks/bench_adapters.py [--tokens 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
QUESTION = "Explain in three sentences why the sky is blue."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from langchain_core.messages import HumanMessage
    from llama_index.core.base.llms.types import ChatMessage
    from transformers.utils import logging as hf_logging

    from ensemble_core.loading import EnsembleSpec, shared_ensemble
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    hf_logging.disable_progress_bar()
    spec = EnsembleSpec.build(MODELS, "safe", {"drafter": "qwen"})
    ensemble = shared_ensemble(spec)
    chat = ChatEnsemble(ensemble=ensemble, max_tokens=args.tokens)
    llm = EnsembleLLM(ensemble=ensemble, max_new_tokens=args.tokens)
    core_prompt = [{"role": "user", "content": QUESTION}]
    lc_prompt = [HumanMessage(QUESTION)]
    li_prompt = [ChatMessage(role="user", content=QUESTION)]

    async def li_astream() -> str:
        text = ""
        async for response in await llm.astream_chat(li_prompt):
            text = response.message.content
        return text

    ways: dict[str, Callable[[], str]] = {
        "core Ensemble.generate": lambda: ensemble.generate(core_prompt, max_new_tokens=args.tokens).text,
        "core asyncio.to_thread(generate)": lambda: (
            asyncio.run(asyncio.to_thread(ensemble.generate, core_prompt, max_new_tokens=args.tokens)).text
        ),
        "LangChain invoke": lambda: chat.invoke(lc_prompt).content,
        "LangChain stream": lambda: "".join(c.content for c in chat.stream(lc_prompt)),
        "LangChain ainvoke": lambda: asyncio.run(chat.ainvoke(lc_prompt)).content,
        "LlamaIndex chat": lambda: llm.chat(li_prompt).message.content,
        "LlamaIndex astream_chat": lambda: asyncio.run(li_astream()),
    }
    texts = {name: way() for name, way in ways.items()}  # warm-up, and every way gives the same text
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - started)
    core = statistics.median(times["core Ensemble.generate"])
    print(f"{args.tokens} tokens, median of {args.rounds} interleaved rounds")
    print("| way | seconds | vs core | same text |\n|---|---|---|---|")
    for name in ways:
        median = statistics.median(times[name])
        same = texts[name].strip() == texts["core Ensemble.generate"].strip()
        print(f"| {name} | {median:.2f} | {median / core:.3f} | {same} |")

    sequential_started = time.perf_counter()
    for _ in range(8):
        chat.invoke(lc_prompt)
    sequential = time.perf_counter() - sequential_started
    gap, concurrent = asyncio.run(_concurrent(chat, lc_prompt))
    print("\n| 8 calls | seconds | ratio |\n|---|---|---|")
    print(f"| sequential invoke | {sequential:.2f} | 1.000 |")
    print(f"| concurrent ainvoke (asyncio.gather) | {concurrent:.2f} | {concurrent / sequential:.3f} |")
    print(f"\nlongest event-loop stall during the concurrent calls: {gap * 1000:.0f} ms")


async def _concurrent(chat: object, prompt: list) -> tuple[float, float]:
    longest, last, done = 0.0, time.perf_counter(), False

    async def ticker() -> None:
        nonlocal longest, last
        while not done:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    await asyncio.gather(*(chat.ainvoke(prompt) for _ in range(8)))  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    done = True
    await task
    return longest, elapsed


if __name__ == "__main__":
    main()
