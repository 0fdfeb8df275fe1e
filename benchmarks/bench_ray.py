"""What hosting members in Ray actors costs: ms/token and bytes on the wire per step.

    python benchmarks/bench_ray.py [--tokens 24] [--rounds 2]

A local Ray cluster (`ray.init(num_cpus=2)`) on this machine; each member runs in its own actor
with one CPU and one torch thread. The local rows give every member the same budget (one
thread in a lane of its own, `HFMember(..., num_threads=1)`), so the ratio is the cost of the
actor and the wire, not of a different thread count. Per method: ms per generated token (greedy,
bf16, median of interleaved rounds) in the driver and over Ray, and the bytes that crossed per
decode step (pickled arguments + results, all members together; `RayMember.traffic`), round trips
per step, and how many whole distributions were fetched (a hosted member sends a summary of
each distribution, `members.wire`, and of each large partial group; whole ones only where a
method needs the full union; the candidates withheld would have cost about 8 bytes each, id and
probability, had the groups crossed whole, as they did before). The last two rows complete a
raw code prompt, whose reply starts with indentation: after a space, tens of thousands of
candidates re-cover it.
Every Ray row must write the same text as its local row (checked and printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")
PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
# Raw code completion (HumanEval's style): the reply starts with indentation, and after a space
# every space-led token re-covers it (a partial group of tens of thousands of candidates).
CODE = 'def is_prime(n: int) -> bool:\n    """Whether n is a prime number."""\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import ray
    from transformers.utils import logging as hf_logging

    from ensemble_core import Ensemble, HFMember, RayMember
    from ensemble_core.members.ray_member import WireTraffic
    from ensemble_core.methods import SAFE, GaC, Single, SpecFuse, SweetSpan

    hf_logging.disable_progress_bar()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    local = [HFMember.from_pretrained(n, device="cpu", dtype="bfloat16", num_threads=1) for n in NAMES]
    hosted = [RayMember.from_pretrained(n, dtype="bfloat16", num_cpus=1, num_threads=1) for n in NAMES]
    methods = {
        "Single (SmolLM2)": (Single(), slice(1, 2), PROMPT),
        "GaC": (GaC(), slice(0, 2), PROMPT),
        "SAFE": (SAFE(), slice(0, 2), PROMPT),
        "SweetSpan": (SweetSpan(), slice(0, 2), PROMPT),
        "SpecFuse": (SpecFuse(), slice(0, 2), PROMPT),
        "GaC, raw code": (GaC(), slice(0, 2), CODE),
        "SAFE, raw code": (SAFE(), slice(0, 2), CODE),
    }
    setups = {
        (label, where): Ensemble((local if where == "local" else hosted)[chosen], method=method)
        for label, (method, chosen, _) in methods.items()
        for where in ("local", "ray")
    }

    def run(key: tuple[str, str]) -> tuple[float, str, int]:
        started = time.perf_counter()
        result = setups[key].generate(methods[key[0]][2], max_new_tokens=args.tokens)
        return (time.perf_counter() - started) / result.usage.completion_tokens, result.text, result.stats.steps

    for key in setups:  # warm-up: prefill paths, unions built, actors' first calls
        run(key)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in setups}
    texts: dict[tuple[str, str], str] = {}
    wire: dict[str, tuple[float, float, float, int, int, float]] = {}
    for _ in range(args.rounds):
        for key in setups:
            counted = key[1] == "ray" and key[0] not in wire
            if counted:
                for member in hosted:
                    member.traffic = WireTraffic()
            seconds, texts[key], steps = run(key)
            times[key].append(seconds)
            if counted:
                sent = sum(m.traffic.sent for m in hosted) / steps
                received = sum(m.traffic.received for m in hosted) / steps
                calls = sum(m.traffic.calls for m in hosted) / steps
                wholes = sum(m.traffic.kinds["about:dense"] for m in hosted)
                groups = sum(m.traffic.kinds["about:group"] for m in hosted)
                withheld = sum(m.traffic.withheld for m in hosted) / steps
                wire[key[0]] = (sent, received, calls, wholes, groups, withheld)
                for member in hosted:
                    member.traffic = None
    median = {key: statistics.median(values) * 1000 for key, values in times.items()}
    print(f"{args.tokens} tokens, greedy, bf16, median of {args.rounds} interleaved rounds; 1 thread per member")
    print(
        "| method | local ms/token | Ray ms/token | Ray / local | sent B/step | received B/step "
        "| partial candidates withheld/step | round trips/step | whole distributions / partial groups fetched "
        "| same text |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label in methods:
        here, there = median[(label, "local")], median[(label, "ray")]
        sent, received, calls, wholes, groups, withheld = wire[label]
        same = texts[(label, "local")] == texts[(label, "ray")]
        print(
            f"| {label} | {here:.0f} | {there:.0f} | {there / here:.2f} | {sent:,.0f} | {received:,.0f} "
            f"| {withheld:,.0f} | {calls:.1f} | {wholes} / {groups} | {same} |"
        )
    for member in hosted:
        member.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
