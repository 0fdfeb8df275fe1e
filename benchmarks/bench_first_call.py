"""What the first boundary-corrected generation of a process pays once, with and without the disk cache.

    python benchmarks/bench_first_call.py [--tokens 64]

Prompt-boundary correction needs per-tokenizer tables (which tokens a tokenizer can emit: one
encode of the whole vocabulary; suffix tables; the union). A process builds them on its first
corrected step; the emittable flags are kept on disk (`vocab.disk_cache`), so only the first
process on a machine pays for them in full. Each row runs in a fresh process:
* per packaged tokenizer, building its `LeafIndex` with an empty cache, then with the cache filled;
* SAFE (drafter Qwen) over Qwen + SmolLM2 on a coding chat prompt: the first generation of the
  process and the same generation again (everything built), with an empty cache, then a filled one.
Greedy, bf16, the machine's CPU threads. Absolute times drift on these machines; compare rows of
one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
CHAT = [
    {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number, with a docstring."}
]


def leaf_seconds(name: str) -> float:
    from transformers import AutoTokenizer

    from ensemble_core.members.covering import LeafIndex
    from ensemble_core.packaged import model_path
    from ensemble_core.vocab import token_table

    tokenizer = AutoTokenizer.from_pretrained(model_path(name))
    table = token_table(tokenizer)
    started = time.perf_counter()
    LeafIndex(tokenizer, table)
    return time.perf_counter() - started


def generation_seconds(tokens: int) -> dict[str, float]:
    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.methods import SAFE

    hf_logging.disable_progress_bar()
    members = [HFMember.from_pretrained(n, device="cpu") for n in NAMES[:2]]
    times = {}
    for key in ("first", "again"):
        ensemble = Ensemble(members, method=SAFE(drafter=NAMES[0]))
        started = time.perf_counter()
        result = ensemble.generate(CHAT, max_new_tokens=tokens)
        elapsed = time.perf_counter() - started
        forwards = sum(m.forward_seconds for m in result.stats.members.values())
        times[key] = elapsed
        times[f"{key}_outside_forwards"] = elapsed - forwards
    return times


def _fresh(argument: str, cache: str, tokens: int) -> dict:
    env = {**os.environ, "ENSEMBLE_LLM_CACHE": cache}
    command = [sys.executable, __file__, "--one", argument, "--tokens", str(tokens)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one measurement, as JSON
    args = parser.parse_args()
    if args.one:
        result = generation_seconds(args.tokens) if args.one == "safe" else {"seconds": leaf_seconds(args.one)}
        print(json.dumps(result))
        return

    from ensemble_core.packaged import model_path

    with tempfile.TemporaryDirectory() as scratch:
        os.symlink(model_path(NAMES[0]).parent, os.path.join(scratch, "models"))  # the converted models, shared
        print(f"first-call costs; bf16, {os.cpu_count()} CPU threads, each row a fresh process")
        print("| what | empty cache (s) | cache filled (s) |")
        print("|---|---|---|")
        for name in NAMES:
            cold = _fresh(name, scratch, args.tokens)["seconds"]
            warm = _fresh(name, scratch, args.tokens)["seconds"]
            print(f"| which tokens {name} emits (`LeafIndex`) | {cold:.2f} | {warm:.2f} |")
        for tokenizers in os.scandir(os.path.join(scratch, "tokenizers")):
            os.remove(tokenizers.path)
        cold = _fresh("safe", scratch, args.tokens)
        warm = _fresh("safe", scratch, args.tokens)
        for key, label in (("first", "first generation"), ("again", "the same generation again")):
            print(
                f"| SAFE Qwen + SmolLM2, {args.tokens} tokens: {label}, outside the model forwards "
                f"| {cold[key + '_outside_forwards']:.2f} | {warm[key + '_outside_forwards']:.2f} |"
            )
            print(f"| SAFE Qwen + SmolLM2, {args.tokens} tokens: {label}, in all | {cold[key]:.2f} | {warm[key]:.2f} |")


if __name__ == "__main__":
    main()
