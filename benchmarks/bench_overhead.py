"""Host work between forwards: reads of tensor values per committed token, and host ms per token.

On a GPU a 0.5B-8B member's forward takes a few milliseconds, so what the ensemble does between
forwards is a direct slowdown, and every read of a tensor's value by Python is a device->host
sync (`ensemble_core.host_reads`). For every method over the pair (Qwen2.5-Coder-0.5B +
SmolLM2) and the trio (+ Gemma-3-270M), and for each member alone through `Single` and through
transformers' own `generate`, this prints:

* reads per committed token (`HostReads`, on the shortest context; counts are deterministic);
* host ms per committed token at each context length, in the steady state: for each decode step
  after the first (which reads the prompt: a request pays that once, and `generate`, handed token
  ids, does not tokenise), its wall time minus the members' own forward time in it (forward
  hooks on the models), summed and divided by the tokens those steps committed; and that figure
  at the longest context over the shortest.

    python benchmarks/bench_overhead.py [--contexts 256 2048 4096] [--tokens 32] [--sets pair trio]
        [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
SETS = {"pair": (QWEN, SMOL), "trio": (QWEN, SMOL, GEMMA)}
CODE = '''def merge_intervals(intervals):
    """Merge overlapping intervals and return them sorted."""
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


'''
TAIL = "def binary_search(items, target):\n"


def methods(names: tuple[str, ...]) -> dict[str, object]:
    from ensemble_core.methods import SAFE, Contrastive, GaC, SpecFuse, SweetSpan, UniTE

    found: dict[str, object] = {
        "gac": GaC(),
        "unite": UniTE(),
        "gate": GaC(threshold=0.5, primary=names[0]),
        "safe": SAFE(drafter=names[0]),
        "sweetspan": SweetSpan(),
        "specfuse": SpecFuse(),
    }
    if len(names) == 2:
        found["contrastive"] = Contrastive()
    return found


def prompt_of(tokens: int, tokenizer) -> str:
    """Raw code of about `tokens` tokens for the first member, ending where a function starts."""
    body = ""
    while len(tokenizer.encode(body + TAIL, add_special_tokens=False)) < tokens:
        body += CODE
    return body + TAIL


@dataclass
class Row:
    label: str
    reads: float = 0.0
    host_ms: dict[int, float] = field(default_factory=dict)


class ForwardClock:
    """Seconds spent inside the models' forwards (hooks on each model), read at any moment."""

    def __init__(self, models) -> None:
        self.seconds, self._started = 0.0, 0.0
        for model in models:
            model.register_forward_pre_hook(self._start)
            model.register_forward_hook(self._stop)

    def _start(self, *_) -> None:
        self._started = time.perf_counter()

    def _stop(self, *_) -> None:
        self.seconds += time.perf_counter() - self._started


@dataclass
class Steps:
    """Per decode step after the first: wall seconds, forward seconds, tokens committed; and the
    tokens the whole generation committed."""

    wall: float = 0.0
    forwards: float = 0.0
    tokens: int = 0
    committed: int = 0

    def host_ms(self) -> float:
        return 1000 * (self.wall - self.forwards) / max(1, self.tokens)


def generate_steps(member, clock: ForwardClock) -> Callable[[str, int], Steps]:
    """transformers' `generate` on the member's model, timed step by step through a streamer."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class Ticks(BaseStreamer):
        def __init__(self) -> None:
            self.marks: list[tuple[float, float]] = []

        def put(self, value) -> None:  # once for the prompt, then once per new token
            self.marks.append((time.perf_counter(), clock.seconds))

        def end(self) -> None:
            pass

    def run(prompt: str, tokens: int, counting: bool = False) -> Steps:
        ids = torch.tensor([member.render(prompt).ids])
        ticks = Ticks()
        with torch.inference_mode():
            member.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                eos_token_id=sorted(member.eos_token_ids),
                pad_token_id=member.tokenizer.pad_token_id or 0,
                streamer=None if counting else ticks,  # (a streamer reads each token: not while counting)
            )
        if counting:
            return Steps(committed=tokens)
        (first_time, first_forward), (last_time, last_forward) = ticks.marks[1], ticks.marks[-1]
        return Steps(last_time - first_time, last_forward - first_forward, len(ticks.marks) - 2, len(ticks.marks) - 1)

    return run


def ensemble_steps(ensemble, clock: ForwardClock) -> Callable[[str, int], Steps]:
    """`Ensemble.generate`, each `DecodeLoop.step` after the first timed (the one request's
    `steps` count gives the tokens each committed; the step that ends it is left out)."""
    from ensemble_core import decode

    def run(prompt: str, tokens: int, counting: bool = False) -> Steps:
        found = Steps()
        original = decode.DecodeLoop.step

        def timed(loop):
            before = [a.steps for a in loop._active]
            started, forwards = time.perf_counter(), clock.seconds
            out = original(loop)
            after = [a.steps for a in loop._active]
            if before and before[0] > 0 and after:  # not the first step, nor the last
                found.wall += time.perf_counter() - started
                found.forwards += clock.seconds - forwards
                found.tokens += after[0] - before[0]
            return out

        decode.DecodeLoop.step = timed
        try:
            found.committed = ensemble.generate(prompt, max_new_tokens=tokens).stats.steps
        finally:
            decode.DecodeLoop.step = original
        return found

    return run


def measure(label: str, run, prompts: dict[int, str], tokens: int) -> Row:
    from ensemble_core.host_reads import HostReads

    row = Row(label)
    shortest = min(prompts)
    for prompt in prompts.values():  # warm-up: tables built once per process, first-call allocations
        run(prompt, tokens)
    with HostReads() as reads:
        found = run(prompts[shortest], tokens, counting=True)
    row.reads = reads.total / max(1, found.committed)
    for context, prompt in prompts.items():
        row.host_ms[context] = run(prompt, tokens).host_ms()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 2048, 4096])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    parser.add_argument("--methods", nargs="*", help="only these methods (default: all)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-alone", action="store_true", help="skip the members alone")
    args = parser.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.methods import Single

    hf_logging.disable_progress_bar()
    names = SETS["trio" if "trio" in args.sets else "pair"]
    members = {n: HFMember.from_pretrained(n, device="cpu", dtype=args.dtype) for n in names}
    clock = ForwardClock(m.model for m in members.values())
    prompts = {c: prompt_of(c, members[QWEN].tokenizer) for c in args.contexts}
    rows: list[Row] = []
    if not args.no_alone:
        for name, member in members.items():
            rows.append(measure(f"{name} alone: generate", generate_steps(member, clock), prompts, args.tokens))
            alone = Ensemble([member], method=Single())
            rows.append(measure(f"{name} alone: Single", ensemble_steps(alone, clock), prompts, args.tokens))
    for set_name in args.sets:
        chosen = [members[n] for n in SETS[set_name]]
        for method_name, method in methods(SETS[set_name]).items():
            if args.methods and method_name not in args.methods:
                continue
            ensemble = Ensemble(chosen, method=method)
            label = f"{method_name}, {set_name}"
            rows.append(measure(label, ensemble_steps(ensemble, clock), prompts, args.tokens))
    contexts = sorted(args.contexts)
    print(
        f"host work per committed token; {args.tokens} greedy tokens, {args.dtype}, CPU threads "
        f"{torch.get_num_threads()}; reads at {contexts[0]} tokens of context"
    )
    header = " | ".join(f"host ms @ {c}" for c in contexts)
    print(f"| decoding | reads / token | {header} | {contexts[-1]} / {contexts[0]} |")
    print("|---|---|" + "---|" * len(contexts) + "---|")
    for row in rows:
        cells = " | ".join(f"{row.host_ms[c]:.2f}" for c in contexts)
        ratio = row.host_ms[contexts[-1]] / max(row.host_ms[contexts[0]], 1e-9)
        print(f"| {row.label} | {row.reads:.1f} | {cells} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
