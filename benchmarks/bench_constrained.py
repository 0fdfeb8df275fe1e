"""What a constraint costs: ms per committed token constrained vs free, and the matcher's share.

For GaC, the gate and SAFE over the packaged pair (Qwen2.5-Coder-0.5B + SmolLM2), each prompt
is generated free and under a JSON schema, greedy, in alternating rounds in one process; the
table gives the median ms per committed token of each, their ratio, and the share of the
constrained run spent in the matcher (`ConstraintState`: allowed sets, checks, commits).
Free and constrained replies differ in text (that is the point), so per-token figures compare.

    python benchmarks/bench_constrained.py [--rounds 3] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN, SMOL = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "remote": {"type": "boolean"},
    },
    "required": ["name", "age", "languages", "remote"],
    "additionalProperties": False,
}
PROMPT = [
    {
        "role": "user",
        "content": "Describe a software engineer as a JSON object with name, age, languages and remote.",
    }
]


class MatcherClock:
    """Seconds spent inside `ConstraintState` methods (wrapped while it is alive)."""

    NAMES = ("allowed_entries", "allows", "allows_end", "advance", "after")

    def __init__(self) -> None:
        from ensemble_core.constraints.matcher import ConstraintState

        self.seconds = 0.0
        self._depth = 0
        self._originals = {name: getattr(ConstraintState, name) for name in self.NAMES}
        for name, original in self._originals.items():
            setattr(ConstraintState, name, self._timed(original))

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:  # nested calls counted once
                    self.seconds += time.perf_counter() - started

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.constraints import JSONSchema
    from ensemble_core.methods import SAFE, GaC

    members = [HFMember.from_pretrained(QWEN), HFMember.from_pretrained(SMOL)]
    methods = {"GaC": GaC(), "gate": GaC(threshold=0.5, primary=QWEN), "SAFE": SAFE(drafter=QWEN)}
    constraint = JSONSchema(PERSON)
    clock = MatcherClock()
    print(f"{args.rounds} rounds, {args.tokens} new tokens, greedy, bf16, schema: {json.dumps(PERSON)[:60]}...")
    print("| method | free ms / token | constrained ms / token | ratio | matcher share | constrained reply |")
    print("|---|---|---|---|---|---|")
    for label, method in methods.items():
        ensemble = Ensemble(members, method=method)
        ensemble.generate(PROMPT, max_new_tokens=4, constraint=constraint)  # tables, the union's grammar tokenizer
        free, constrained, shares, reply = [], [], [], ""
        for _ in range(args.rounds):
            started = time.perf_counter()
            result = ensemble.generate(PROMPT, max_new_tokens=args.tokens)
            free.append((time.perf_counter() - started) * 1000 / result.stats.steps)
            clock.seconds = 0.0
            started = time.perf_counter()
            result = ensemble.generate(PROMPT, max_new_tokens=args.tokens, constraint=constraint)
            wall = time.perf_counter() - started
            constrained.append(wall * 1000 / result.stats.steps)
            shares.append(clock.seconds / wall)
            reply = result.text
        a, b = statistics.median(free), statistics.median(constrained)
        print(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} | {statistics.median(shares):.1%} | `{reply[:50]}` |")


if __name__ == "__main__":
    main()
