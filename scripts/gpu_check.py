"""Every method on a GPU, and on a GPU and the CPU mixed, against the CPU float32 run.

Run on a machine with CUDA (after `make demo`'s setup):

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/gpu_check.py [--tokens 32]

For each method over Qwen + SmolLM2 (and the trio for the token methods) it generates greedily
in float32 three ways: all members on the CPU (the reference), all on `cuda`, and Qwen on
`cuda` with SmolLM2 on the CPU; it prints one line per method and placement with the text
agreement and the time, and exits non-zero if any placement fails to run. Greedy text may
differ from the CPU run where two candidates are within float noise of each other (different
kernels): the first differing position and both candidates' texts are printed so a reader can
judge it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = ["Once upon a time, in a small village,", "def fibonacci(n):\n"]


def members_on(devices: dict[str, str]):
    from ensemble_core import HFMember

    return [HFMember.from_pretrained(name, device=device, dtype="float32") for name, device in devices.items()]


def methods():
    from ensemble_core.methods import SAFE, GaC, Single, SpecFuse, SweetSpan, UniTE

    return {
        "single": Single(),
        "gac": GaC(),
        "gate": GaC(threshold=0.5),
        "unite": UniTE(),
        "safe": SAFE(drafter="qwen"),
        "sweetspan": SweetSpan(),
        "specfuse": SpecFuse(),
    }


def first_difference(a: str, b: str) -> str:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at char {k}: {a[k : k + 20]!r} vs {b[k : k + 20]!r}"
    return f"one is a prefix of the other ({len(a)} vs {len(b)} chars)"


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check (this script needs a GPU)")
        return 2
    from ensemble_core import Ensemble

    names = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")
    placements = {
        "cpu": {n: "cpu" for n in names},
        "cuda": {n: "cuda" for n in names},
        "cuda+cpu": {names[0]: "cuda", names[1]: "cpu"},
    }
    loaded = {key: members_on(devices) for key, devices in placements.items()}
    failures = 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; greedy, float32, {args.tokens} tokens")
    print("| method | prompt | placement | same text as CPU | seconds |")
    print("|---|---|---|---|---|")
    for method_name, method in methods().items():
        for p, prompt in enumerate(PROMPTS):
            reference = None
            for key, members in loaded.items():
                started = time.perf_counter()
                try:
                    result = Ensemble(members, method=method).generate(prompt, max_new_tokens=args.tokens)
                except Exception as error:
                    failures += 1
                    print(f"| {method_name} | {p} | {key} | FAILED: {type(error).__name__}: {error} | |")
                    continue
                seconds = time.perf_counter() - started
                if reference is None:
                    reference = result.text
                same = result.text == reference
                note = "yes" if same else f"no ({first_difference(result.text, reference)})"
                print(f"| {method_name} | {p} | {key} | {note} | {seconds:.2f} |")
    print(f"\nfailures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
