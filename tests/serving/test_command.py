"""`ensemble-llm serve`'s options: defaults, a YAML file, the command line over both; every
mistake is an error naming the fix, before any model loads (the example starts the real command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ensemble_core.cli import build_parser, main
from ensemble_core.serving.command import API_KEY_ENV, options_of


def parsed(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_the_command_line_wins_over_the_file_and_the_file_over_defaults(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "serve.yaml"
    models = "models: [qwen2.5-coder-0.5b-instruct, smollm2-135m-instruct]\n"
    config.write_text(models + "method: gac\nport: 9000\nmax-batch: 4\n")
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    options = options_of(parsed("--config", str(config), "--port", "9100", "--method-params", '{"weights": "auto"}'))
    assert options["model"] == ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
    assert (options["method"], options["port"], options["max_batch"]) == ("gac", 9100, 4)
    assert options["method_params"] == {"weights": "auto"}
    assert options["host"] == "127.0.0.1"  # this machine only, unless asked
    assert options["api_key"] == "from-env"
    assert options_of(parsed("-m", "x", "--api-key", "given"))["api_key"] == "given"
    config.write_text("model: x\ncors_origin: https://app.example.com\n")  # one origin, not its letters
    assert options_of(parsed("--config", str(config)))["cors_origin"] == ["https://app.example.com"]


def test_the_default_is_an_ensemble_with_auto_weights_for_several_models_and_the_model_for_one(tmp_path: Path) -> None:
    from ensemble_core.loading import EnsembleSpec

    def spec(*argv: str) -> EnsembleSpec:
        options = options_of(parsed(*argv))
        return EnsembleSpec.build(options["model"], options["method"], options["method_params"])

    pair = spec("-m", "qwen2.5-coder-0.5b-instruct", "-m", "smollm2-135m-instruct")
    assert (pair.method, pair.method_params) == ("gac", {"weights": "auto"})
    assert spec("-m", "qwen2.5-coder-0.5b-instruct").method == "single"
    equal = spec("-m", "a", "-m", "b", "--method", "unite", "--weights", "equal")
    assert equal.method_params == {"weights": "equal"}
    assert spec("-m", "a", "-m", "b", "--weights", "0.7,0.3").method_params == {"weights": [0.7, 0.3]}
    config = tmp_path / "serve.yaml"
    config.write_text("models: [a, b]\nweights: [0.25, 0.75]\n")
    assert spec("--config", str(config)).method_params == {"weights": [0.25, 0.75]}


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        ((), None, "at least one model"),
        (("-m", "x", "-m", "y", "--weights", "auto", "--method-params", '{"weights": "equal"}'), None, "once"),
        (("-m", "x", "--method-params", "{drafter"), None, "not valid JSON"),
        (("-m", "x", "--max-batch", "0"), None, "max_batch"),
        (("-m", "x", "--default-tokens", "900", "--max-tokens", "800"), None, "above max_tokens"),
        ((), "model: x\nthreads: 3\n", "unknown options \\['threads'\\]"),
        (("-m", "x", "--method", "nope"), None, "nope"),
        (("-m", "x", "--request-timeout", "0"), None, "request_timeout` must be a positive"),
        ((), "model: x\nrequest_timeout: 10m\n", "request_timeout` must be a positive"),
        ((), "model: x\napi_key: 12345678\n", "`api_key` must be a string"),
        ((), "model: x\ncors_origin: [1]\n", "`cors_origin` must be a list"),
        ((), "model: x\ncors_origin:\n", "`cors_origin` must be a list"),
    ],
)
def test_mistakes_fail_before_loading(argv, config, message, tmp_path: Path, capsys) -> None:
    if config is not None:
        path = tmp_path / "serve.yaml"
        path.write_text(config)
        argv = (*argv, "--config", str(path))
    assert main(["serve", *argv]) == 2
    assert re.search(message, capsys.readouterr().err)
