"""`ensemble-llm eval`: the command line of an evaluation (a YAML config, or lists of members,
methods and tasks), checked before any model loads. (Imports nothing heavy until it runs, so the
other commands stay quick.)"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ensemble_core.cli_options import add_device_options, add_member_options, method_params_option, weights_option
from ensemble_core.errors import ConfigError

if TYPE_CHECKING:
    from ensemble_core.eval.config import EvalConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="a YAML evaluation config (see examples/eval.yaml)")
    add_member_options(parser, compare=True)
    add_device_options(parser)
    parser.add_argument(
        "--tasks", help="comma list of task[:style][:seedN][@problems], e.g. humaneval:raw@0-39,arithmetic@50"
    )
    parser.add_argument(
        "--boundary",
        choices=["correct", "retokenize"],
        help="how members continue each other's text: correct (the default) or retokenize (the papers')",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="problems generated together (default 8)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (records.jsonl, report.md, plots/)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars (one line per finished cell)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--report-only", action="store_true", help="write the report from the records; run nothing")
    only.add_argument(
        "--rescore",
        action="store_true",
        help="score the stored replies again with the current scorers, then write the report; generate nothing",
    )
    parser.add_argument("--no-plots", action="store_true", help="write the report without its figures")


def config_from(args: argparse.Namespace) -> EvalConfig:
    """The evaluation the arguments describe (YAML, or the lists), fully checked."""
    from ensemble_core.eval.config import build_config, load_config

    overrides = _device_overrides(args)
    if args.out is not None:
        overrides["output"] = str(args.out)
    if args.batch_size is not None:
        overrides["batch_size"] = args.batch_size
    if args.config is not None:
        given = [flag for flag, value in _MATRIX_FLAGS.items() if getattr(args, value) is not None]
        if given:
            raise ConfigError(
                f"Give either --config or the matrix on the command line, not both: {', '.join(given)} "
                "would be ignored (the YAML file says members, methods, parameters, weights and boundary "
                "per configuration)."
            )
        config = load_config(args.config)
        return (
            build_config({**config.model_dump(mode="json"), **overrides}, where=str(args.config))
            if overrides
            else config
        )
    if not (args.model and args.method and args.tasks):
        raise ConfigError("Give --config FILE, or -m (each member), --method (each method) and --tasks.")
    return build_config(
        {
            "tasks": [_task(part) for part in _split(args.tasks)],
            "configurations": _configurations(args),
            "output": "eval-results/cli",
            **overrides,
        },
        where="the command line",
    )


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _task(text: str) -> dict[str, Any]:
    name, _, problems = text.partition("@")
    parts = name.split(":")
    spec: dict[str, Any] = {"task": parts[0]}
    for part in parts[1:]:
        if part.startswith("seed") and part[4:].isdigit():
            spec["seed"] = int(part[4:])
        else:
            spec["style"] = part
    if problems:
        spec["problems"] = int(problems) if problems.isdigit() else problems
    return spec


_MATRIX_FLAGS = {
    "-m/--model": "model",
    "--method": "method",
    "--tasks": "tasks",
    "--method-params": "method_params",
    "--weights": "weights",
    "--boundary": "boundary",
}


def _device_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--device / --dtype: they override a config's (where the models run is not the evaluation)."""
    return {key: value for key in ("device", "dtype") if (value := getattr(args, key, None)) is not None}


def _configurations(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One configuration per method x weighting; --method-params go to every method listed (each
    checks them: a parameter a method does not take is an error that names it)."""
    params = method_params_option(args.method_params)
    if "weights" in params:
        raise ConfigError("Give the weights with --weights (repeat to compare), not in --method-params.")
    given = [weights_option(text) for text in args.weights] if args.weights else None
    boundary = args.boundary or "correct"
    found = []
    for method in args.method:
        base = {"members": list(args.model), "method": method, "boundary": boundary}
        if not _takes_weights(method):  # each member alone (single), or no weights (contrastive)
            found.append({**base, "params": {} if method.lower() == "single" else params})
            continue
        # the front ends' default (`loading.front_end_params`): auto where the method finds weights
        weightings = given or (["auto"] if _finds_weights(method) else ["equal"])
        for weighting in weightings:
            found.append({**base, "params": params, "weights": None if weighting == "equal" else weighting})
    return found


_NOT_REPRODUCED = ("--report-only", "--rescore", "--quiet")


def reproduce_command(argv: Sequence[str]) -> str:
    """The command a reader runs to get the same records: without the flags that only change
    how this call ran (a report written from existing records, no progress bars)."""
    return "ensemble-llm " + " ".join(shlex.quote(a) for a in argv if a not in _NOT_REPRODUCED)


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from ensemble_core.eval.output import write_report
    from ensemble_core.eval.runner import Evaluation

    config = config_from(args)
    evaluation = Evaluation(config, quiet=args.quiet)
    cells = evaluation.cells()  # fingerprints checked before anything loads
    command = reproduce_command(argv if argv is not None else sys.argv[1:])
    only = "--rescore" if args.rescore else "--report-only" if args.report_only else None
    if only and not any(evaluation.records.done(c.name, c.task.key, i.id) for c in cells for i in c.items):
        raise ConfigError(
            f"{only}: {evaluation.path} holds no records of this evaluation's configurations and problems yet; "
            f"run the same command without {only} to measure them."
        )
    if args.rescore:
        sys.stdout.write(f"{evaluation.rescore()}\n")
    elif not args.report_only:
        try:
            evaluation.run()
        except KeyboardInterrupt:
            sys.stderr.write(
                f"\ninterrupted: {len(evaluation.records.records)} records are kept in {evaluation.path}; "
                "run the same command again to resume.\n"
            )
            return 130
    path = write_report(config, evaluation.records, command, plots=not args.no_plots)
    sys.stdout.write(f"report: {path}\nrecords: {evaluation.path}\n")
    return 0


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="the YAML evaluation config to calibrate within")
    parser.add_argument("--configuration", required=True, help="the name of the configuration to calibrate")
    parser.add_argument(
        "--task", required=True, help="held-out slice: task[:style][:seedN]@problems, e.g. gsm8k:raw@1000-1039"
    )
    parser.add_argument(
        "--write", type=Path, default=None, help="the YAML to write (default: <config>.calibrated.yaml)"
    )
    parser.add_argument(
        "--weights",
        action="append",
        metavar="W",
        help="a weighting to try (repeat): equal, prompt, agreement, or MEMBER:LEAD with LEAD 0.5, 0.7 or 0.9 "
        "(e.g. qwen:0.9); default: all of them",
    )
    add_device_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bars (one line per finished candidate)")


def calibrate(args: argparse.Namespace) -> int:
    from ensemble_core.eval.calibrate import Calibration, write_calibrated
    from ensemble_core.eval.config import TaskSpec, file_safe, load_config

    config = load_config(args.config)
    overrides = _device_overrides(args)
    if overrides:
        config = config.model_copy(update=overrides)
    task = TaskSpec(**_task(args.task))
    if task.problems is None:
        raise ConfigError("--task needs its held-out problems after '@', e.g. gsm8k:raw@1000-1039.")
    out = Path(config.output) / "calibration" / file_safe(args.configuration)
    weights = [part for text in args.weights for part in _split(text)] if args.weights is not None else None
    calibration = Calibration(config, args.configuration, task, out, args.quiet, weights=weights)
    try:
        chosen, rows = calibration.run()
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted: the candidates' records are kept; run the same command again to resume.\n")
        return 130
    target = args.write or args.config.with_suffix(".calibrated.yaml")
    write_calibrated(args.config, chosen, rows, target, task)
    for row in rows:
        sys.stdout.write(f"{row.config}: {row.correct}/{row.total}\n")
    sys.stdout.write(f"chosen: {chosen.model_dump(exclude_defaults=True)}\nwritten: {target}\n")
    return 0


def _finds_weights(method: str) -> bool:
    """Whether a method (by name) takes a weights rule such as "auto" (SweetSpan and SpecFuse
    take numbers only)."""
    from ensemble_core.methods import METHODS

    cls = METHODS.get(method.lower())
    return cls is not None and cls.finds_weights


def _takes_weights(method: str) -> bool:
    """Whether a method (by name) has member weights to vary; an unknown name is left to the
    config check, which names it."""
    from ensemble_core.methods import METHODS  # (torch: not for every command line)

    cls = METHODS.get(method.lower())
    return cls is not None and any(f.name == "weights" for f in dataclasses.fields(cls))
