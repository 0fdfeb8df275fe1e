"""One prepared GPU run: every method on real packaged models, timed, sync-counted and checked.

Run it once on a machine with one CUDA GPU (about 6-8 minutes on an H100):

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/gpu_check.py [--tokens 32] [--out gpu_check.json]

and as a smoke test on a CPU-only machine (pair, float32, batch 1, short prompt):

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python scripts/gpu_check.py --device cpu --quick --tokens 4

What it checks, over the pair (Qwen2.5-Coder 0.5B + SmolLM2 135M) and the trio (+ Gemma-3 270M),
in float32 and bfloat16, with every method (Contrastive on the pair only):

* it runs: each generation is caught on its own; an error is recorded and the run goes on, and the
  exit status is 1 when any run raised;
* latency: wall ms per committed token (`stats.steps`) for a short and a ~2,000-token raw code
  prompt, at batch 1 and batch 4, against each member alone through transformers' own
  `model.generate` and through `Single`: the ratios to the sum of the members' ms/token (what
  running them one after another costs) and to the slowest member;
* device syncs per committed token, counted two ways: `HostReads` (Python reads of tensor values,
  entered in the calling thread AND in the ensemble's lane threads, because torch keeps function
  modes per thread and GPU members step in a lane thread) and CUDA's own sync debug mode (its
  warnings recorded);
* determinism: seeded sampling (temperature 0.8, float32) gives the same text twice; a prompt's
  batch-4 text equals its batch-1 text; the counted greedy run (24 tokens) begins the timed one;
* agreement with the CPU: that counted float32 greedy text of 24 tokens on CUDA against the same
  run on the CPU (short prompt, batch 1), with the first differing character when they differ
  (kernels differ, so a near tie may go the other way: the texts are in the JSON to judge).

Each timed generation is `--tokens` (32) new tokens, after one 4-token warm-up per ensemble;
sync counts and the seed repeat are float32 only (they do not depend on the dtype).

Raw string prompts are used throughout (Gemma-3 270M is a base model without a chat template).
Runs are ordered by importance (float32 on the device, then the CPU reference, then bfloat16);
once `--budget-s` has passed, the remaining runs are recorded as skipped instead of started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from ensemble_core import Ensemble, HFMember
from ensemble_core.host_reads import HostReads
from ensemble_core.methods import SAFE, Contrastive, GaC, Method, Single, SpecFuse, SweetSpan, UniTE

PAIR = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")
TRIO = (*PAIR, "gemma-3-270m")
SHORT_PROMPTS = (
    "def is_prime(n):\n    ",
    "# Return the n-th Fibonacci number.\ndef fibonacci(n):\n",
    "The three primary colours are",
    "import json\n\n\ndef load_config(path):\n    ",
)
LONG_UNIT = '''def scale_{i}(values, factor={i}):
    """Multiply every value by {i} and keep the results that are not negative."""
    kept = []
    for value in values:
        if value * factor >= 0:
            kept.append(value * factor)
    return kept


'''
LONG_TAIL = "def scale_all(values):\n"
REFERENCE_TOKENS = 24  # the CPU reference is slow: fewer tokens than the timed runs
WARMUP_TOKENS = 4
TEMPERATURE = 0.8
SEED = 20240611
BATCH = 4


# ---------------------------------------------------------------------------- setup


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options a future session passes (all have defaults fit for one H100 run)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="where the members run (default: cuda)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per timed generation")
    parser.add_argument("--long-tokens", type=int, default=2000, help="Qwen tokens in the long prompt")
    parser.add_argument("--quick", action="store_true", help="pair, float32, batch 1, short prompt only")
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON results go")
    parser.add_argument("--budget-s", type=float, default=450.0, help="start no run after this many seconds")
    return parser.parse_args(argv)


def method_factories(first: str, group: Sequence[str]) -> dict[str, Callable[[], Method]]:
    """Every method, named as in the results; Contrastive needs exactly an expert and an amateur."""
    factories: dict[str, Callable[[], Method]] = {
        "single": Single,
        "gac": GaC,
        "unite": UniTE,
        "gate": lambda: GaC(threshold=0.5, primary=first),
        "contrastive": Contrastive,
        "safe": lambda: SAFE(drafter=first),
        "sweetspan": SweetSpan,
        "specfuse": SpecFuse,
    }
    if len(group) != 2:
        del factories["contrastive"]
    return factories


def long_code_prompt(tokenizer: Any, target_tokens: int) -> str:
    """Raw Python of about `target_tokens` Qwen tokens: distinct small functions (not one line
    repeated, which a model would only copy), ending where a new function starts."""
    pieces: list[str] = []
    while len(tokenizer.encode("".join(pieces) + LONG_TAIL, add_special_tokens=False)) < target_tokens:
        pieces.append(LONG_UNIT.format(i=len(pieces) + 1))
    return "".join(pieces) + LONG_TAIL


def environment(device: str) -> dict[str, Any]:
    """Versions and the card, so numbers from different machines are not compared unknowingly."""
    import transformers

    found: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "cpu_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        found["gpu"] = torch.cuda.get_device_name(0)
        found["cuda"] = torch.version.cuda
    return found


def load_members(names: Sequence[str], device: str, dtype: str) -> list[HFMember]:
    """The packaged models by name; members of one dtype and device are shared by all ensembles."""
    return [HFMember.from_pretrained(name, device=device, dtype=dtype) for name in names]


def release(members: Sequence[HFMember], device: str) -> None:
    """Free a dtype's models before the next is loaded (two dtypes of three models fit, but the
    allocator's cache would otherwise blur the memory the next dtype's runs see)."""
    for member in members:
        member.close()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- bookkeeping


class Recorder:
    """Runs each piece of work on its own: records its fields, or its error and traceback, or
    that it was skipped because the time budget was spent (the run must end in time). The JSON
    is rewritten after every run, so a run killed at its time limit still leaves its results."""

    def __init__(self, budget_s: float, out: str, header: dict[str, Any]):
        self.started = time.perf_counter()
        self.budget_s = budget_s
        self.out = out
        self.header = header
        self.rows: list[dict[str, Any]] = []
        self.failures = 0
        self.skipped = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def run(self, row: dict[str, Any], work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`work()`'s fields merged into `row` (recorded either way); `row["error"]` on failure."""
        if self.elapsed() > self.budget_s:
            row["skipped"] = f"time budget of {self.budget_s:.0f} s spent"
            self.skipped += 1
        else:
            try:
                row.update(work())
            except Exception as error:  # one failed run must not hide the others' results
                row["error"] = f"{type(error).__name__}: {error}"
                row["traceback"] = traceback.format_exc(limit=8)
                self.failures += 1
                print(f"  ERROR {label(row)}: {row['error']}", flush=True)
        self.rows.append(row)
        self.save(finished=False)
        return row

    def save(self, finished: bool) -> list[dict[str, Any]]:
        """Write the results so far (`finished`: the whole run ended) and return the summary."""
        lines = summary(self.rows)
        report = {
            **self.header,
            "finished": finished,
            "elapsed_s": self.elapsed(),
            "failures": self.failures,
            "skipped": self.skipped,
            "summary": lines,
            "runs": self.rows,
        }
        with open(self.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1, default=str)
        return lines


def label(row: dict[str, Any]) -> str:
    """A run's identity in one short string, for progress and error lines."""
    keys = ("section", "dtype", "group", "method", "member", "run")
    return " ".join(str(row[k]) for k in keys if row.get(k) is not None)


def first_difference(a: str, b: str) -> int | None:
    """The first character position where two texts differ (None: equal); a prefix differs
    at the shorter one's end."""
    if a == b:
        return None
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def per_token(value: float | None, tokens: int) -> float | None:
    """A count or a time spread over committed tokens (None when nothing was committed)."""
    return None if value is None or tokens <= 0 else value / tokens


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# ---------------------------------------------------------------------------- measuring


def synchronize(device: str) -> None:
    """Wait for queued kernels, so a wall time covers the work and not only its launch."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, work: Callable[[], Any]) -> tuple[Any, float]:
    """`work()` and its wall seconds, the device drained before and after."""
    synchronize(device)
    started = time.perf_counter()
    value = work()
    synchronize(device)
    return value, time.perf_counter() - started


@contextlib.contextmanager
def lane_reads(ensemble: Ensemble | None) -> Iterator[list[HostReads]]:
    """A `HostReads` entered in each of the ensemble's lane threads.

    Torch keeps function modes per thread, and members on a GPU step in their GPU's lane thread:
    a `HostReads` entered only in the calling thread misses every read they make there. The
    lanes are reached through the ensemble's private `_lanes` (none: nothing to add).
    """
    lanes = list(getattr(getattr(ensemble, "_lanes", None), "_lanes", {}).values())
    entered: list[tuple[Any, HostReads]] = []
    try:
        for lane in lanes:
            mode = HostReads()
            lane.call(mode.__enter__)
            entered.append((lane, mode))
        yield [mode for _, mode in entered]
    finally:
        for lane, mode in reversed(entered):
            lane.call(lambda mode=mode: mode.__exit__(None, None, None))


@contextlib.contextmanager
def cuda_sync_warnings(enabled: bool) -> Iterator[list[warnings.WarningMessage]]:
    """CUDA's sync debug mode at "warn", every warning recorded (no once-per-line filtering),
    set back to off afterwards. Disabled (off the GPU): records nothing."""
    if not enabled:
        yield []
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(0)


def count_syncs(device: str, ensemble: Ensemble | None, work: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """`work()` under both counters at once (not timed: the function mode slows every op)."""
    on_cuda = device.startswith("cuda")
    with cuda_sync_warnings(on_cuda) as caught, lane_reads(ensemble) as in_lanes, HostReads() as here:
        value = work()
    sites = here.by_site.copy()
    for mode in in_lanes:
        sites.update(mode.by_site)
    counts = {
        "host_reads_caller": here.total,
        "host_reads_lanes": sum(mode.total for mode in in_lanes),
        "cuda_sync_warnings": sum("synchroniz" in str(w.message) for w in caught) if on_cuda else None,
        "top_read_sites": sites.most_common(6),
    }
    return value, counts


def result_fields(result: Any, call_s: float) -> dict[str, Any]:
    """What one prompt's result says about speed and text, as plain JSON values."""
    stats = result.stats
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "steps": stats.steps,
        "wall_s": stats.wall_seconds,
        "call_s": call_s,
        "ms_per_token": per_token(stats.wall_seconds * 1000, stats.steps),
        "token_counts": {name: len(ids) for name, ids in result.token_ids.items()},
        "member_forwards": {
            name: {
                "forwards": s.forwards,
                "forward_s": s.forward_seconds,
                "forwarded_tokens": s.forwarded_tokens,
                "rollbacks": s.rollbacks,
                "sat_out": s.sat_out,
            }
            for name, s in stats.members.items()
        },
    }


def sync_fields(counts: dict[str, Any], steps: int) -> dict[str, Any]:
    """Sync counts and the same per committed token."""
    total_reads = counts["host_reads_caller"] + counts["host_reads_lanes"]
    return {
        **counts,
        "host_reads_per_token": per_token(total_reads, steps),
        "cuda_syncs_per_token": per_token(counts["cuda_sync_warnings"], steps),
    }


def hf_generate(member: HFMember, prompt: str, tokens: int) -> tuple[int, str]:
    """Greedy decoding by transformers alone, exactly `tokens` new tokens (EOS suppressed, so
    the per-token time covers the same count as the ensemble's runs ask for)."""
    tokenizer, model = member.tokenizer, member.model
    assert model is not None, "member was closed"
    encoded = tokenizer(prompt, return_tensors="pt").to(member.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        output = model.generate(
            **encoded, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=pad
        )
    new = output[0, encoded["input_ids"].shape[1] :]
    return int(new.shape[0]), tokenizer.decode(new, skip_special_tokens=True)


# ---------------------------------------------------------------------------- sections


def member_baselines(
    rec: Recorder, members: Sequence[HFMember], dtype: str, prompts: dict[str, str], args: argparse.Namespace
) -> dict[tuple[str, str], float]:
    """Each member alone, through `model.generate` and through `Single`: (prompt, member) ->
    transformers' ms/token, the yardstick the methods' times are divided by."""
    baseline: dict[tuple[str, str], float] = {}
    count = dtype == "float32"  # sync counts do not depend on the dtype: count once
    for member in members:
        base = {"section": "member", "dtype": dtype, "member": member.name}
        rec.run({**base, "run": "warmup"}, lambda member=member: warm_member(member))
        for key, prompt in prompts.items():
            row = rec.run({**base, "run": f"hf_generate {key}"}, lambda m=member, p=prompt: hf_timed(m, p, args))
            if row.get("ms_per_token") is not None:
                baseline[(key, member.name)] = row["ms_per_token"]
            if count and key == "short":
                rec.run({**base, "run": "hf_generate short syncs"}, lambda m=member, p=prompt: hf_counted(m, p, args))
            single = Ensemble([member], method=Single())
            row = rec.run({**base, "run": f"single {key}"}, lambda e=single, p=prompt: generate_timed(e, p, args))
            row["ratio_to_hf"] = ratio(row.get("ms_per_token"), baseline.get((key, member.name)))
    return baseline


def warm_member(member: HFMember) -> dict[str, Any]:
    """Kernels, caches and the allocator warmed for this member before anything is timed."""
    hf_generate(member, SHORT_PROMPTS[0], WARMUP_TOKENS)
    Ensemble([member], method=Single()).generate(SHORT_PROMPTS[0], max_new_tokens=WARMUP_TOKENS)
    return {}


def hf_timed(member: HFMember, prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    (tokens, text), seconds = timed(args.device, lambda: hf_generate(member, prompt, args.tokens))
    return {"text": text, "steps": tokens, "call_s": seconds, "ms_per_token": per_token(seconds * 1000, tokens)}


def hf_counted(member: HFMember, prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    (tokens, _), counts = count_syncs(args.device, None, lambda: hf_generate(member, prompt, args.tokens))
    return sync_fields(counts, tokens)


def generate_timed(ensemble: Ensemble, prompt: str, args: argparse.Namespace, **sampling: Any) -> dict[str, Any]:
    result, seconds = timed(args.device, lambda: ensemble.generate(prompt, max_new_tokens=args.tokens, **sampling))
    return result_fields(result, seconds)


def compare_tokens(args: argparse.Namespace) -> int:
    """New tokens of the counted run, which the CPU reference repeats (the CPU is slow)."""
    return min(args.tokens, REFERENCE_TOKENS)


def generate_counted(ensemble: Ensemble, prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy under the sync counters; its text is also the one compared with the CPU's."""
    tokens = compare_tokens(args)
    result, counts = count_syncs(args.device, ensemble, lambda: ensemble.generate(prompt, max_new_tokens=tokens))
    return {"text": result.text, "steps": result.stats.steps, **sync_fields(counts, result.stats.steps)}


def batch_timed(ensemble: Ensemble, prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One batched greedy call: ms per committed token over the whole batch, texts per prompt."""
    results, seconds = timed(args.device, lambda: ensemble.generate_batch(prompts, max_new_tokens=args.tokens))
    steps = [r.stats.steps for r in results]
    return {
        "texts": [r.text for r in results],
        "steps": steps,
        "call_s": seconds,
        "ms_per_token": per_token(seconds * 1000, sum(steps)),
        "ms_per_step": per_token(seconds * 1000, max(steps)),
    }


def add_ratios(row: dict[str, Any], key: str, group: Sequence[str], baseline: dict[tuple[str, str], float]) -> None:
    """The method's ms/token against the members' own: their sum and the slowest of them."""
    own = [baseline.get((key, name)) for name in group]
    if row.get("ms_per_token") is None or any(v is None for v in own):
        return
    row["members_sum_ms_per_token"] = sum(own)
    row["slowest_member_ms_per_token"] = max(own)
    row["ratio_to_sum"] = ratio(row["ms_per_token"], sum(own))
    row["ratio_to_slowest"] = ratio(row["ms_per_token"], max(own))


def method_section(
    rec: Recorder,
    members: Sequence[HFMember],
    dtype: str,
    prompts: dict[str, str],
    baseline: dict[tuple[str, str], float],
    args: argparse.Namespace,
) -> dict[tuple[str, str], str]:
    """Every method over the pair and the trio (the pair only with --quick); returns the counted
    greedy texts by (group, method), which the CPU reference is compared with."""
    groups = {"pair": PAIR} if args.quick else {"pair": PAIR, "trio": TRIO}
    by_name = {m.name: m for m in members}
    compare_texts: dict[tuple[str, str], str] = {}
    for group_name, group in groups.items():
        for method_name, factory in method_factories(group[0], group).items():
            base = {"section": "method", "dtype": dtype, "group": group_name, "method": method_name}
            print(f"[{rec.elapsed():6.1f} s] {label(base)}", flush=True)
            built = rec.run({**base, "run": "build+warmup"}, lambda g=group, f=factory: build(by_name, g, f))
            ensemble = built.pop("ensemble", None)
            if ensemble is None:
                continue
            text = method_runs(rec, ensemble, base, group, prompts, baseline, args)
            if text is not None:
                compare_texts[(group_name, method_name)] = text
    return compare_texts


def build(by_name: dict[str, HFMember], group: Sequence[str], factory: Callable[[], Method]) -> dict[str, Any]:
    """An ensemble over already loaded members, warmed by one short generation."""
    ensemble = Ensemble([by_name[name] for name in group], method=factory())
    ensemble.generate(SHORT_PROMPTS[0], max_new_tokens=WARMUP_TOKENS)
    return {"ensemble": ensemble}


def method_runs(
    rec: Recorder,
    ensemble: Ensemble,
    base: dict[str, Any],
    group: Sequence[str],
    prompts: dict[str, str],
    baseline: dict[tuple[str, str], float],
    args: argparse.Namespace,
) -> str | None:
    """One ensemble's runs. Float32 adds the sync count and the seed check (neither depends on
    the dtype); returns the counted greedy text, which the CPU reference is compared with."""
    short = prompts["short"]
    greedy = rec.run({**base, "run": "short greedy"}, lambda: generate_timed(ensemble, short, args))
    add_ratios(greedy, "short", group, baseline)
    full = base["dtype"] == "float32"
    counted: dict[str, Any] = {}
    if full:
        counted = rec.run({**base, "run": "short greedy syncs"}, lambda: generate_counted(ensemble, short, args))
        if "text" in counted and "text" in greedy:
            counted["timed_text_starts_with_this"] = greedy["text"].startswith(counted["text"])
    sampled_runs(rec, ensemble, base, short, greedy, args, repeat=full)
    if "long" in prompts:
        long_runs(rec, ensemble, base, group, prompts, greedy, baseline, args)
    return counted.get("text")


def sampled_runs(
    rec: Recorder,
    ensemble: Ensemble,
    base: dict[str, Any],
    prompt: str,
    greedy: dict[str, Any],
    args: argparse.Namespace,
    repeat: bool,
) -> None:
    """Seeded sampling, and with `repeat` the same seed again: a seed must fix the text."""
    sampling = {"temperature": TEMPERATURE, "seed": SEED}
    first = rec.run({**base, "run": "short sampled"}, lambda: generate_timed(ensemble, prompt, args, **sampling))
    first["differs_from_greedy"] = None if "text" not in greedy else first.get("text") != greedy["text"]
    if repeat:
        again = rec.run(
            {**base, "run": "short sampled again"}, lambda: generate_timed(ensemble, prompt, args, **sampling)
        )
        again["same_text_as_first"] = same_text(again, first)


def long_runs(
    rec: Recorder,
    ensemble: Ensemble,
    base: dict[str, Any],
    group: Sequence[str],
    prompts: dict[str, str],
    greedy: dict[str, Any],
    baseline: dict[tuple[str, str], float],
    args: argparse.Namespace,
) -> None:
    """The long prompt alone, then in a batch with short ones (padded to very different
    lengths): each prompt's batched text should equal its batch-1 text."""
    long_row = rec.run({**base, "run": "long greedy"}, lambda: generate_timed(ensemble, prompts["long"], args))
    add_ratios(long_row, "long", group, baseline)
    batch = [prompts["short"], prompts["long"], *SHORT_PROMPTS[1 : BATCH - 1]]
    batched = rec.run({**base, "run": f"batch{BATCH} greedy"}, lambda: batch_timed(ensemble, batch, args))
    if "texts" in batched:
        batched["same_as_batch1"] = [
            same_text({"text": batched["texts"][0]}, greedy),
            same_text({"text": batched["texts"][1]}, long_row),
        ]


def same_text(row: dict[str, Any], other: dict[str, Any]) -> bool | None:
    """Whether two runs wrote the same text (None when either has none)."""
    if "text" not in row or "text" not in other:
        return None
    return row["text"] == other["text"]


def cpu_reference(rec: Recorder, device_texts: dict[tuple[str, str], str], short: str, tokens: int) -> None:
    """The same float32 greedy runs on the CPU, compared with the device's texts."""
    if not device_texts:
        return
    loaded = rec.run({"section": "cpu", "run": "load"}, lambda: {"members": load_members(TRIO, "cpu", "float32")})
    members = loaded.pop("members", None)
    if members is None:
        return
    by_name = {m.name: m for m in members}
    groups = {"pair": PAIR, "trio": TRIO}
    for (group_name, method_name), device_text in device_texts.items():
        group = groups[group_name]
        factory = method_factories(group[0], group)[method_name]
        base = {"section": "cpu", "dtype": "float32", "group": group_name, "method": method_name}
        print(f"[{rec.elapsed():6.1f} s] {label(base)}", flush=True)
        rec.run(
            {**base, "run": "compare"},
            lambda g=group, f=factory, t=device_text: compare(by_name, g, f, short, t, tokens),
        )
    release(members, "cpu")


def compare(
    by_name: dict[str, HFMember],
    group: Sequence[str],
    factory: Callable[[], Method],
    prompt: str,
    device_text: str,
    tokens: int,
) -> dict[str, Any]:
    """The CPU's text for one method and whether (and where) the device's text differs."""
    ensemble = Ensemble([by_name[name] for name in group], method=factory())
    text = ensemble.generate(prompt, max_new_tokens=tokens).text
    return {
        "cpu_text": text,
        "device_text": device_text,
        "equal": text == device_text,
        "first_difference": first_difference(text, device_text),
    }


def dtype_section(
    rec: Recorder, dtype: str, prompts: dict[str, str], args: argparse.Namespace
) -> dict[tuple[str, str], str]:
    """Load one dtype's members, time them alone, then run every method; frees them after."""
    names = PAIR if args.quick else TRIO
    print(f"[{rec.elapsed():6.1f} s] loading {dtype} on {args.device}", flush=True)
    loaded = rec.run({"section": "load", "dtype": dtype}, lambda: {"members": load_members(names, args.device, dtype)})
    members = loaded.pop("members", None)
    if members is None:
        return {}
    if "long" not in prompts and not args.quick:
        prompts["long"] = long_code_prompt(members[0].tokenizer, args.long_tokens)
    loaded["prompt_tokens"] = {
        key: {m.name: len(m.tokenizer.encode(text)) for m in members} for key, text in prompts.items()
    }
    baseline = member_baselines(rec, members, dtype, prompts, args)
    texts = method_section(rec, members, dtype, prompts, baseline, args)
    release(members, args.device)
    return texts


# ---------------------------------------------------------------------------- report


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (dtype, group, method) and per member, from the run rows."""
    lines: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if row.get("section") == "member":
            key = ("member", row["dtype"], row["member"])
            line = lines.setdefault(key, {"what": "member", "dtype": row["dtype"], "name": row["member"], "errors": 0})
        elif row.get("section") in ("method", "cpu") and row.get("method"):
            key = ("method", row["dtype"], row["group"], row["method"])
            line = lines.setdefault(
                key,
                {"what": row["group"], "dtype": row["dtype"], "name": row["method"], "errors": 0},
            )
        else:
            continue
        line["errors"] += "error" in row
        line["skipped"] = line.get("skipped", 0) + ("skipped" in row)
        fold(line, row)
    return list(lines.values())


def fold(line: dict[str, Any], row: dict[str, Any]) -> None:
    """Copy the figures the table shows from one run row into its summary line."""
    run = row.get("run", "")
    if run in ("short greedy", "hf_generate short"):
        line["short_ms"] = row.get("ms_per_token")
        line["x_sum"], line["x_slowest"] = row.get("ratio_to_sum"), row.get("ratio_to_slowest")
    elif run in ("long greedy", "hf_generate long"):
        line["long_ms"] = row.get("ms_per_token")
    elif run == "single short":
        line["single_short_ms"] = row.get("ms_per_token")
    elif run == "single long":
        line["single_long_ms"] = row.get("ms_per_token")
    elif run.startswith("batch"):
        line["batch_ms"] = row.get("ms_per_token")
        line["batch_same"] = all(row["same_as_batch1"]) if "same_as_batch1" in row else None
    elif run.endswith("syncs"):
        line["reads_per_token"] = row.get("host_reads_per_token")
        line["syncs_per_token"] = row.get("cuda_syncs_per_token")
    elif run == "short sampled again":
        line["seed_repeats"] = row.get("same_text_as_first")
    elif run == "compare":
        line["cpu_equal"] = row.get("equal")
        line["cpu_first_diff"] = row.get("first_difference")


def cell(value: Any, digits: int = 1) -> str:
    """A table cell: numbers rounded, missing as '-', booleans as y/n."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "y" if value else "N"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def print_table(lines: list[dict[str, Any]]) -> None:
    """The compact table: ms per committed token, ratios, syncs per token and the checks."""
    columns = (
        ("dtype", "dtype", 0),
        ("what", "group", 0),
        ("name", "method/member", 0),
        ("short_ms", "ms/tok", 1),
        ("long_ms", "long", 1),
        ("batch_ms", "b4", 1),
        ("single_short_ms", "single", 1),
        ("x_sum", "x_sum", 2),
        ("x_slowest", "x_slow", 2),
        ("reads_per_token", "reads/t", 2),
        ("syncs_per_token", "syncs/t", 2),
        ("seed_repeats", "seed", 0),
        ("batch_same", "b4=b1", 0),
        ("cpu_equal", "cpu=", 0),
        ("cpu_first_diff", "diff@", 0),
        ("errors", "err", 0),
        ("skipped", "skip", 0),
    )
    widths = [max(len(title), 6) for _, title, _ in columns]
    widths[2] = max(widths[2], *(len(str(line.get("name", ""))) for line in lines)) if lines else widths[2]
    print(" ".join(title.ljust(w) for (_, title, _), w in zip(columns, widths, strict=True)))
    for line in lines:
        cells = [cell(line.get(key), digits) for key, _, digits in columns]
        print(" ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()  # generation-config chatter would bury the table
    transformers.logging.disable_progress_bar()  # as would a loading bar per model and dtype
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu (and --quick) off the GPU")
        return 2
    prompts: dict[str, str] = {"short": SHORT_PROMPTS[0]}  # the long one joins once a tokenizer is loaded
    header = {"environment": environment(args.device), "options": vars(args), "prompts": prompts}
    rec = Recorder(args.budget_s, args.out, header)
    device_texts = dtype_section(rec, "float32", prompts, args)
    if args.device.startswith("cuda"):
        cpu_reference(rec, device_texts, prompts["short"], compare_tokens(args))
    if not args.quick:
        dtype_section(rec, "bfloat16", prompts, args)
    lines = rec.save(finished=True)
    print()
    print_table(lines)
    print(
        f"\n{rec.failures} runs raised, {rec.skipped} skipped, {rec.elapsed():.0f} s; "
        f"ms/tok = wall ms per committed token; x_sum / x_slow = that over the members' own "
        f"model.generate ms/tok summed / slowest; results in {args.out}"
    )
    return 1 if rec.failures else 0


if __name__ == "__main__":
    sys.exit(main())
