"""The options every `ensemble-llm` command that loads models shares: one spelling, one shape
and one default each, so a configuration moves between `run`, `serve`, `eval` and `calibrate`
as it is (docs/reference/cli.md).

* `-m/--model NAME` (repeat): the members; packaged names, Hub ids or folders (eval: or aliases).
* `--method NAME`: default `gac` for several models, `single` for one (eval: repeat to compare).
* `--method-params JSON`: the method's own parameters, a JSON object.
* `--weights W`: `auto` (default), `equal`, `prompt`, `agreement` or numbers `0.7,0.3`
  (eval and calibrate: repeat to compare).
* `--device`, `--dtype`: default the first GPU (else the CPU) and the checkpoint's dtype.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ensemble_core.errors import ConfigError

WEIGHT_WORDS = ("auto", "equal", "prompt", "agreement")
WEIGHTS_HELP = "auto (the default: prompt-likelihood weights per request), equal, prompt, agreement, or numbers 0.7,0.3"


def add_member_options(parser: argparse.ArgumentParser, *, compare: bool = False, required: bool = False) -> None:
    """-m, --method, --method-params and --weights; `compare` (eval) makes --method and
    --weights repeatable, one configuration per combination."""
    parser.add_argument(
        "-m",
        "--model",
        action="append",
        required=required,
        metavar="NAME",
        help="a member: packaged name, Hub id or folder"
        + (" or a config alias" if compare else "")
        + " (repeat for an ensemble)",
    )
    if compare:
        parser.add_argument(
            "--method",
            action="append",
            metavar="NAME",
            help="a method to measure (repeat): single (each member alone), gac, unite, safe, contrastive, "
            "sweetspan, specfuse",
        )
    else:
        parser.add_argument(
            "--method",
            metavar="NAME",
            help="gac, unite, safe, contrastive, sweetspan, specfuse or single "
            "(default: gac for several models, single for one)",
        )
    parser.add_argument(
        "--method-params",
        metavar="JSON",
        help='the method\'s parameters as a JSON object, e.g. \'{"drafter": "qwen"}\' for safe',
    )
    parser.add_argument(
        "--weights",
        action="append" if compare else None,
        metavar="W",
        help=WEIGHTS_HELP + (" (repeat to compare)" if compare else ""),
    )


def add_device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: the first GPU, else the CPU)")
    parser.add_argument("--dtype", help="auto (the default: the checkpoint's), bfloat16, float16 or float32")


def default_method(models: Sequence[Any]) -> str:
    """An ensemble for several models, the model itself for one."""
    return "gac" if len(models) > 1 else "single"


def method_params_option(text: str | None) -> dict[str, Any]:
    """`--method-params`: a JSON object ({} when not given)."""
    example = '{"drafter": "qwen"}'
    if text is None:
        return {}
    try:
        found = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"--method-params is not valid JSON ({error}); e.g. '{example}'.") from None
    if not isinstance(found, dict):
        raise ConfigError(f"--method-params must be a JSON object, e.g. '{example}'.")
    return found


def weights_option(text: str) -> str | list[float]:
    """One `--weights` value: a word, or comma-separated numbers (one per member)."""
    word = text.strip().lower()
    if word in WEIGHT_WORDS:
        return word
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--weights takes {WEIGHTS_HELP}; not {text!r}.") from None


def with_weights(params: dict[str, Any], weights: str | None) -> dict[str, Any]:
    """The method's parameters with `--weights` in them (said twice is an error, not a choice)."""
    if weights is None:
        return params
    if "weights" in params:
        raise ConfigError("Give the weights once: --weights, or `weights` in --method-params, not both.")
    return {**params, "weights": weights_option(weights)}
