"""`ensemble-llm serve`: load the ensemble, then serve it with uvicorn until stopped.

Every option can come from the command line or from a YAML file (`--config`); the command
line wins. Everything is checked before any model is loaded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ensemble_core.cli_options import (
    add_device_options,
    add_member_options,
    default_method,
    method_params_option,
    with_weights,
)
from ensemble_core.errors import ConfigError
from ensemble_core.extras import require_extra

API_KEY_ENV = "ENSEMBLE_LLM_API_KEY"
"""Where the API key is read from when `--api-key` is not given."""

_DEFAULTS: dict[str, Any] = {
    "model": [],
    "method": None,  # gac for several models, single for one
    "method_params": {},
    "weights": None,  # auto, for the methods that find weights (loading.front_end_params)
    "device": None,
    "dtype": "auto",
    "placement": "local",
    "host": "127.0.0.1",
    "port": 8000,
    "api_key": None,
    "model_id": None,
    "max_batch": 8,
    "max_queue": 64,
    "request_timeout": 600.0,
    "default_tokens": 256,
    "max_tokens": 4096,
    "max_body_bytes": 1 << 20,
    "cors_origin": [],
    "grace": 30.0,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file with any of the options below (as keys, with _)")
    add_member_options(parser)
    add_device_options(parser)
    parser.add_argument("--placement", help="local (default), ray (each member in a Ray actor) or ray://host:port")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, help="default 8000")
    parser.add_argument("--api-key", help=f"require `Authorization: Bearer KEY` (default: ${API_KEY_ENV}, else none)")
    parser.add_argument("--model-id", help="the model id clients use (default: the ensemble's name)")
    parser.add_argument("--max-batch", type=int, help="requests generating at once (default 8)")
    parser.add_argument("--max-queue", type=int, help="requests waiting beyond those; more get 429 (default 64)")
    parser.add_argument("--request-timeout", type=float, help="seconds per request, queue included (default 600)")
    parser.add_argument("--default-tokens", type=int, help="max_tokens when a request gives none (default 256)")
    parser.add_argument("--max-tokens", type=int, help="the largest max_tokens a request may ask (default 4096)")
    parser.add_argument("--max-body-bytes", type=int, help="the largest request body (default 1 MiB)")
    parser.add_argument("--cors-origin", action="append", help="allow CORS from this origin (repeat; default: off)")
    parser.add_argument(
        "--grace", type=float, help="on SIGTERM/SIGINT, seconds in-flight requests may take to finish (default 30)"
    )


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options: defaults, then the YAML file, then the command line; checked."""
    options = dict(_DEFAULTS)
    if args.config is not None:
        options.update(_read_config(args.config))
    given = {key: value for key, value in vars(args).items() if key in _DEFAULTS and value is not None}
    if "method_params" in given:
        given["method_params"] = method_params_option(given["method_params"])
    options.update(given)
    if not options["model"]:
        raise ConfigError("Give at least one model: -m NAME (repeat for an ensemble), or `model:` in --config.")
    if not isinstance(options["method_params"], dict):
        raise ConfigError("`method_params` must be a JSON/YAML object of the method's parameters.")
    weights = options.pop("weights")
    if weights is not None and not isinstance(weights, str):  # a YAML list of numbers
        weights = ",".join(str(w) for w in weights)
    options["method_params"] = with_weights(options["method_params"], weights)
    options["method"] = options["method"] or default_method(options["model"])
    options["api_key"] = options["api_key"] or os.environ.get(API_KEY_ENV) or None
    for name in ("port", "max_batch", "max_queue", "default_tokens", "max_tokens", "max_body_bytes"):
        if not isinstance(options[name], int) or options[name] < 1:
            raise ConfigError(f"`{name}` must be a positive integer, but is {options[name]!r}.")
    if options["default_tokens"] > options["max_tokens"]:
        raise ConfigError(f"default_tokens={options['default_tokens']} is above max_tokens={options['max_tokens']}.")
    for name in ("request_timeout", "grace"):
        seconds = options[name]
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ConfigError(f"`{name}` must be a positive number of seconds, but is {seconds!r}.")
    for name in ("api_key", "model_id", "host"):
        if options[name] is not None and not isinstance(options[name], str):
            raise ConfigError(f"`{name}` must be a string, but is {options[name]!r}; quote it in the YAML file.")
    origins = options["cors_origin"]
    if isinstance(origins, str):
        options["cors_origin"] = origins = [origins]
    if not isinstance(origins, (list, tuple)) or not all(isinstance(origin, str) for origin in origins):
        raise ConfigError(f"`cors_origin` must be a list of origins, but is {origins!r}.")
    return options


def _read_config(path: Path) -> dict[str, Any]:
    require_extra("yaml", "serve")
    import yaml

    if not path.is_file():
        raise ConfigError(f"--config {path} does not exist.")
    found = yaml.safe_load(path.read_text()) or {}
    if not isinstance(found, dict):
        raise ConfigError(f"{path} must hold a mapping of options, e.g. `model: [qwen2.5-coder-0.5b-instruct]`.")
    found = {key.replace("-", "_"): value for key, value in found.items()}
    if "models" in found:
        found["model"] = found.pop("models")
    unknown = sorted(set(found) - set(_DEFAULTS))
    if unknown:
        raise ConfigError(f"{path} has unknown options {unknown}; known: {sorted(_DEFAULTS)}.")
    if isinstance(found.get("model"), str):
        found["model"] = [found["model"]]
    return found


def serve(args: argparse.Namespace) -> int:
    require_extra("fastapi", "serve")
    require_extra("uvicorn", "serve")
    require_extra("sse_starlette", "serve")
    require_extra("prometheus_client", "serve")
    options = options_of(args)
    import uvicorn

    from ensemble_core.loading import EnsembleSpec
    from ensemble_core.serving.app import ServeSettings, create_app
    from ensemble_core.serving.shutdown import DrainingServer

    spec = EnsembleSpec.build(
        options["model"],
        options["method"],
        options["method_params"],
        options["device"],
        options["dtype"],
        options["placement"],
    )
    settings = ServeSettings(
        model_id=options["model_id"],
        api_key=options["api_key"],
        max_batch=options["max_batch"],
        max_queue=options["max_queue"],
        request_timeout=float(options["request_timeout"]),
        default_tokens=options["default_tokens"],
        max_tokens=options["max_tokens"],
        max_body_bytes=options["max_body_bytes"],
        cors_origins=tuple(options["cors_origin"]),
    )
    from ensemble_core.ensemble import Ensemble

    if spec.placement != "local":
        require_extra("ray", "ray")
    with Ensemble(spec.load_members(), method=spec.method, method_params=spec.method_params) as ensemble:
        app = create_app(ensemble, settings)
        print(f"serving {settings.model_id or ensemble.model_name} on http://{options['host']}:{options['port']}/v1")  # noqa: T201
        config = uvicorn.Config(app, host=options["host"], port=options["port"], log_level="info", lifespan="on")
        server = DrainingServer(config, app.state.batcher, float(options["grace"]))
        server.run()
    if server.drained is False:
        print("shut down: requests still running after the grace period were ended with 503")  # noqa: T201
    return 0
