"""Segment-level ensembling with a long shared prefix: our cached rounds vs a reference-style
round that re-prefills the whole context every round (as the papers' code does).

    python benchmarks/bench_segment.py [--rounds 4]

Three packaged members, a ~512-token shared prefix, segments of 10 tokens, greedy, bf16.
* ours: SpecFuse with exit off (every member drafts every round, as the reference does),
  time per steady round (the prompt's one prefill is not a per-round cost);
* reference-style: per round and member, `generate` over the whole context (prefill + 10
  steps, a fresh cache), then one forward over the context followed by all candidates (the
  token count of the reference's block-masked verification pass), per member;
* and SpecFuse with exit on, per generated token, against the sum of the members' own
  cached greedy decode per token on the same prompt.
All measured in this one run.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
PARAGRAPH = (
    "The harbour town woke slowly. Fishermen checked their nets, the baker opened his shutters, "
    "and gulls argued over scraps on the pier. Nobody noticed the small boat drifting in with the tide. "
)


def long_prompt(tokenizer, target: int = 512) -> str:
    text = ""
    while len(tokenizer.encode(text)) < target:
        text += PARAGRAPH
    return text + "One morning,"


def reference_round(members, contexts: list[list[int]], segment: int) -> list[list[int]]:
    """Draft with a fresh cache per member, then verify all candidates in one pass each."""
    import torch

    candidates = []
    for member, context in zip(members, contexts, strict=True):
        with torch.inference_mode():
            out = member.model.generate(
                torch.tensor([context]),
                attention_mask=torch.ones(1, len(context), dtype=torch.long),
                do_sample=False,
                max_new_tokens=segment,
                min_new_tokens=segment,
                pad_token_id=member.tokenizer.pad_token_id,
            )
        candidates.append(member.tokenizer.decode(out[0, len(context) :], skip_special_tokens=True))
    for member, context in zip(members, contexts, strict=True):
        joined = context + [t for c in candidates for t in member.tokenizer.encode(c, add_special_tokens=False)]
        with torch.inference_mode():
            member.model(input_ids=torch.tensor([joined]))
    return [member.tokenizer.encode(candidates[0], add_special_tokens=False) for member in members]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.methods import Single, SpecFuse

    hf_logging.disable_progress_bar()
    members = [HFMember.from_pretrained(n, device="cpu") for n in NAMES]
    prompt = long_prompt(members[0].tokenizer)
    lengths = [len(m.render(prompt).ids) for m in members]

    no_exit = Ensemble(members, method=SpecFuse(exit=False, unit="tokens"))
    no_exit.generate(prompt, max_new_tokens=10)  # warm-up

    def timed_rounds(rounds: int) -> tuple[float, int]:
        started = time.perf_counter()
        result = no_exit.generate(prompt, max_new_tokens=10 * rounds)
        return time.perf_counter() - started, result.stats.method_stats.rounds

    # The one prefill of the prompt is paid once per generation, not per round: a steady
    # round is the difference between a long and a one-round generation, per extra round.
    one, one_rounds = timed_rounds(1)
    many, many_rounds = timed_rounds(args.rounds + 1)
    ours_round = (many - one) / (many_rounds - one_rounds)

    contexts = [m.render(prompt).ids for m in members]
    started = time.perf_counter()
    for _ in range(args.rounds):
        winner = reference_round(members, contexts, 10)
        contexts = [c + w for c, w in zip(contexts, winner, strict=True)]
    reference = (time.perf_counter() - started) / args.rounds

    with_exit = Ensemble(members, method=SpecFuse())
    tokens = 10 * args.rounds * 2
    started = time.perf_counter()
    fused = with_exit.generate(prompt, max_new_tokens=tokens)
    fused_per_token = (time.perf_counter() - started) / fused.usage.completion_tokens
    own = 0.0
    for name in NAMES:
        single = Ensemble(members, method=Single(member=name))
        started = time.perf_counter()
        alone = single.generate(prompt, max_new_tokens=tokens)
        own += (time.perf_counter() - started) / alone.usage.completion_tokens

    print(f"3 members, shared prefix of {min(lengths)}-{max(lengths)} tokens (per tokenizer), segments of 10 tokens")
    print("| measure | value | goal |")
    print("|---|---|---|")
    print(f"| reference-style round (re-prefill every round) | {reference:.2f} s | |")
    print(f"| our round (cached, SpecFuse without exit) | {ours_round:.2f} s | |")
    print(f"| speed-up per round | {reference / ours_round:.1f}x | >= 3x |")
    print(f"| SpecFuse with exit, per token | {fused_per_token * 1e3:.0f} ms | |")
    print(f"| sum of the members' own cached decode, per token | {own * 1e3:.0f} ms | |")
    print(f"| SpecFuse with exit / sum of members | {fused_per_token / own:.2f}x | <= 2.0x |")
    per_round = fused.stats.method_stats.per_round
    drafting = sum(len(r.drafters) for r in per_round) / len(per_round)
    print(f"| members drafting per round (SpecFuse with exit) | {drafting:.1f} | |")


if __name__ == "__main__":
    main()
