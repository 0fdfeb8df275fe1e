"""Token-level ensembles on the three packaged models: what the ensemble adds on top of the
models' own forwards, measured side by side in one run.

    python benchmarks/bench_token.py [--tokens 128] [--rounds 2] [--boundary correct|retokenize]

Two settings: A, all three members on a raw story prompt (the papers' "challenging setting":
two much weaker members); B, Qwen + SmolLM2 on a coding chat prompt. Rows (greedy, bf16, per
generated token so an early EOS is fair):
* GaC every token / the sum of each member's own cached greedy decode (goal <= 1.15);
* SAFE (drafter Qwen) / Qwen alone (goal <= 1.5);
* GaC with the key-token gate (threshold 0.5, primary Qwen) / Qwen alone (goal <= 1.5);
* in B, contrastive decoding (expert Qwen) / the sum of both alone (both run every step, as for
  GaC; there is no top-k shortcut: every step takes the expert's whole distribution);
plus the share of tokens ensembled, and the union's build time and size. `--boundary retokenize`
times the same rows without the prompt-boundary correction, which separates what the member
contract costs from what the correction costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")

_UNION_PROBE = """
import time, os
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoConfig, AutoTokenizer
from ensemble_core.chat.templates import chat_end_token_ids
from ensemble_core.packaged import model_path
from ensemble_core.vocab import token_table
from ensemble_core.vocab.union import build_union
names = %r
tables, eos, widths = [], [], []
for name in names:
    tok = AutoTokenizer.from_pretrained(model_path(name))
    tables.append(token_table(tok))
    eos.append(frozenset({tok.eos_token_id} | chat_end_token_ids(tok)))
    widths.append(AutoConfig.from_pretrained(model_path(name)).vocab_size)
start = time.perf_counter()
union = build_union(tables, eos, widths)
first = time.perf_counter() - start
start = time.perf_counter()
build_union(tables, eos, widths)
again = time.perf_counter() - start
size = sum(m.to_union.numel() * 8 + m.first_id.numel() * 8 for m in union.maps)
print(union.size, first, again, size / 1e6)
"""


CHAT = [
    {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number, with a docstring."}
]


def measure(members, prompt, tokens: int, rounds: int, boundary: str) -> tuple[dict[str, float], dict[str, object]]:
    """Median seconds per generated token of each member alone and of GaC, SAFE and the gate
    (and contrastive decoding, for two members)."""
    from ensemble_core import Ensemble
    from ensemble_core.methods import SAFE, Contrastive, GaC, Single

    names = [m.name for m in members]
    setups = {name: Ensemble(members, method=Single(member=name), boundary=boundary) for name in names}
    setups["gac"] = Ensemble(members, method=GaC(), boundary=boundary)
    setups["safe"] = Ensemble(members, method=SAFE(drafter=names[0]), boundary=boundary)
    setups["gate"] = Ensemble(members, method=GaC(threshold=0.5, primary=names[0]), boundary=boundary)
    if len(members) == 2:
        setups["contrastive"] = Ensemble(members, method=Contrastive(expert=names[0]), boundary=boundary)
    for ensemble in setups.values():  # warm-up at full length: the union and the tables built
        ensemble.generate(prompt, max_new_tokens=tokens)  # once per process are not timed
    times: dict[str, list[float]] = {k: [] for k in setups}
    results = {}
    for _ in range(rounds):
        for key, ensemble in setups.items():
            started = time.perf_counter()
            results[key] = ensemble.generate(prompt, max_new_tokens=tokens)
            times[key].append((time.perf_counter() - started) / results[key].usage.completion_tokens)
    return {k: statistics.median(v) for k, v in times.items()}, results


def table(title: str, names: list[str], t: dict[str, float], results: dict[str, object]) -> None:
    print(f"\n{title}")
    print("| measure | ms / token | ratio | goal | share ensembled | floor ms / token | ratio to floor |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        print(f"| {name} alone | {t[name] * 1e3:.0f} | | | | | |")
    own_sum = sum(t[n] for n in names)
    for key, label in (("gac", "GaC every token"), ("contrastive", "contrastive")):
        if key in t:  # both members on every token: the floor is the sum of their own decoding
            ratio = t[key] / own_sum
            print(
                f"| {label} vs sum of members alone | {t[key] * 1e3:.0f} | {ratio:.2f} | <= 1.15 | 100% "
                f"| {own_sum * 1e3:.0f} | {ratio:.2f} |"
            )
    short = names[0].split("-")[0]
    for key, label in (
        ("safe", f"SAFE (drafter {short}) vs {short} alone"),
        ("gate", f"GaC gate 0.5 vs {short} alone"),
    ):
        share = results[key].stats.method_stats.share_ensembled
        # The forwards no implementation can avoid at this share: the drafter/primary on
        # every token, the others on the ensembled ones.
        floor = t[names[0]] + share * sum(t[n] for n in names[1:])
        ratio = t[key] / t[names[0]]
        print(
            f"| {label} | {t[key] * 1e3:.0f} | {ratio:.2f} | <= 1.5 | {share:.0%} "
            f"| {floor * 1e3:.0f} | {t[key] / floor:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--boundary", choices=("correct", "retokenize"), default="correct")
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    from ensemble_core import HFMember

    hf_logging.disable_progress_bar()
    members = [HFMember.from_pretrained(n, device="cpu") for n in NAMES]
    print(
        f"greedy, up to {args.tokens} new tokens, bf16, {os.cpu_count()} CPU threads, median of {args.rounds}, "
        f"boundary={args.boundary}"
    )
    t, results = measure(members, PROMPT, args.tokens, args.rounds, args.boundary)
    table("A. all three (the papers' challenging setting), a raw story prompt", list(NAMES), t, results)
    t, results = measure(members[:2], CHAT, args.tokens, args.rounds, args.boundary)
    table("B. Qwen + SmolLM2, a coding chat prompt", list(NAMES[:2]), t, results)
    out = subprocess.run([sys.executable, "-c", _UNION_PROBE % (NAMES,)], capture_output=True, text=True, check=True)
    size, first, again, megabytes = out.stdout.split()
    print(
        f"\nunion of the 3 vocabularies: {int(size):,} entries; built in {float(first):.2f} s in a fresh process, "
        f"{float(again) * 1e3:.3f} ms when built again (memoised); index maps {float(megabytes):.1f} MB"
    )


if __name__ == "__main__":
    main()
