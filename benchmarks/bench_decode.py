"""Greedy decode speed: our cached member loop (Ensemble + Single) vs transformers' generate.

For each packaged model, in a fresh process (so peak RSS is that model's alone): load, warm
up, then alternate ours / HF for several rounds on the same prompt, and report the median
time of each and their ratio, measured in the same run. Both produce the same tokens (the
test suite checks that), so the ratio is a like-for-like speed comparison.

    python benchmarks/bench_decode.py [--tokens 128] [--rounds 3] [--models NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct")


def measure(name: str, tokens: int, rounds: int) -> dict[str, float | int | str]:
    import torch
    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember

    hf_logging.disable_progress_bar()
    member = HFMember.from_pretrained(name, device="cpu")
    ensemble = Ensemble([member], method="single", boundary="retokenize")  # exactly what generate does
    ids = member.render(PROMPT).ids
    inputs = torch.tensor([ids])
    mask = torch.ones_like(inputs)

    def ours() -> int:
        return ensemble.generate(PROMPT, max_new_tokens=tokens).usage.completion_tokens

    def hf() -> int:
        with torch.inference_mode():
            out = member.model.generate(
                inputs,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=tokens,
                eos_token_id=sorted(member.eos_token_ids),
                pad_token_id=member.tokenizer.pad_token_id,
            )
        return out.shape[1] - len(ids)

    ensemble.generate(PROMPT, max_new_tokens=8)  # warm-up: first-call allocations, kernels
    hf_times, our_times, generated = [], [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        generated = hf()
        hf_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        ours_generated = ours()
        our_times.append(time.perf_counter() - started)
        if ours_generated != generated:
            raise RuntimeError(f"{name}: ours generated {ours_generated} tokens, HF {generated}")
    return {
        "model": name,
        "tokens": generated,
        "hf_s": statistics.median(hf_times),
        "ours_s": statistics.median(our_times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one model, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.tokens, args.rounds)))
        return
    rows = []
    for name in args.models:
        command = [sys.executable, __file__, "--one", name, "--tokens", str(args.tokens), "--rounds", str(args.rounds)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"greedy decode, {args.tokens} new tokens, bf16, CPU threads: {os.cpu_count()}; median of {args.rounds}")
    print("| model | tokens | HF generate tok/s | ours tok/s | ours / HF speed | peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        hf_rate, our_rate = row["tokens"] / row["hf_s"], row["tokens"] / row["ours_s"]
        print(
            f"| {row['model']} | {row['tokens']} | {hf_rate:.1f} | {our_rate:.1f} | "
            f"{our_rate / hf_rate:.2f}x | {row['peak_rss_mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
