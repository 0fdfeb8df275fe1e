"""Members that step concurrently: GaC over Qwen + SmolLM2, each member with one CPU thread.

    python benchmarks/bench_concurrency.py [--tokens 48] [--rounds 3]

Each member gets a budget of one intra-op thread (`HFMember(..., num_threads=1)` gives it a lane
of its own, `ensemble_core.members.lanes`). Rows, per generated token, greedy, bf16, median of
interleaved rounds, all in one process on the same loaded weights:
* each member alone with one thread;
* GaC with both members stepping one after another, each with one thread (the sum);
* GaC with both members in their own lanes, stepping concurrently (goal: <= 1.15x the slowest
  member alone);
* GaC as a user gets it without budgets: both members in the calling thread with the
  process's threads, one after another.
Every GaC row must write the same text (checked and printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.methods import GaC, Single

    hf_logging.disable_progress_bar()
    process_threads = torch.get_num_threads()
    loaded = [HFMember.from_pretrained(name, device="cpu", dtype="bfloat16") for name in NAMES]

    def members(num_threads: int | None) -> list[HFMember]:
        return [HFMember(m.model, m.tokenizer, name=m.name, num_threads=num_threads) for m in loaded]

    one_thread = members(1)
    setups: dict[str, tuple[Ensemble, int]] = {
        f"{m.name} alone, 1 thread": (Ensemble(members(1)[i : i + 1], method=Single()), 1)
        for i, m in enumerate(one_thread)
    }
    setups["GaC sequential, 1 thread each"] = (Ensemble(members(None), method=GaC()), 1)
    setups["GaC concurrent lanes, 1 thread each"] = (Ensemble(one_thread, method=GaC()), process_threads)
    setups[f"GaC sequential, {process_threads} threads shared"] = (Ensemble(members(None), method=GaC()), 0)

    def run(key: str) -> tuple[float, str]:
        ensemble, caller_threads = setups[key]
        torch.set_num_threads(caller_threads or process_threads)
        try:
            started = time.perf_counter()
            result = ensemble.generate(PROMPT, max_new_tokens=args.tokens)
            return (time.perf_counter() - started) / result.usage.completion_tokens, result.text
        finally:
            torch.set_num_threads(process_threads)

    for key in setups:  # warm-up (prefill paths, union built)
        run(key)
    times: dict[str, list[float]] = {key: [] for key in setups}
    texts: dict[str, str] = {}
    for _ in range(args.rounds):
        for key in setups:
            seconds, texts[key] = run(key)
            times[key].append(seconds)
    median = {key: statistics.median(values) * 1000 for key, values in times.items()}
    slowest = max(median[f"{name} alone, 1 thread"] for name in NAMES)
    total = sum(median[f"{name} alone, 1 thread"] for name in NAMES)
    gac_texts = {texts[key] for key in setups if key.startswith("GaC")}
    print(f"{args.tokens} tokens, greedy, bf16, median of {args.rounds} interleaved rounds, {process_threads} cores")
    print("| configuration | ms / token | vs slowest alone | vs sum alone | goal |\n|---|---|---|---|---|")
    for key, value in median.items():
        goal = "<= 1.15" if key.startswith("GaC concurrent") else ""
        print(f"| {key} | {value:.0f} | {value / slowest:.2f} | {value / total:.2f} | {goal} |")
    print(f"\nevery GaC configuration wrote the same text: {len(gac_texts) == 1}")
    for ensemble, _ in setups.values():
        ensemble.close()


if __name__ == "__main__":
    main()
