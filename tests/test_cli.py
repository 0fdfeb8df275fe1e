"""The `ensemble-llm` command."""

from __future__ import annotations

import pytest

from ensemble_core.cli import main
from ensemble_core.errors import ConfigError


def test_models_list_shows_every_packaged_model_and_its_state(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.split()[1:3] == ["yes", "yes"]  # installed, prepared (the test setup prepares them)


def test_prepare_reports_prepared_models_and_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "prepare", "gemma-3-270m"]) == 0
    assert "gemma-3-270m: already prepared at" in capsys.readouterr().out
    assert main(["models", "prepare", "gemma-3-270m", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert "Unknown packaged model 'gpt-5'" in err


def test_run_streams_a_generation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "Once upon a time", "--raw", "-m", "gemma-3-270m", "--max-new-tokens", "8"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "[length; 8 tokens" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--method", "gca"), "Unknown method 'gca'"),
        (("--method", "safe", "--method-params", '{"drafter": "qwne"}'), "`drafter` is 'qwne'"),
        (("--method-params", "{drafter"), "not valid JSON"),
        (("--max-new-tokens", "0"), "max_new_tokens"),
        (("--stop", ""), "non-empty strings"),
        (("--dtype", "float13"), "`dtype` must be one of"),  # the loader checks it before reading a file
    ],
)
def test_run_checks_its_arguments_before_loading_a_model(argv, message, capsys) -> None:
    """The models named do not exist: had loading come first, the error would be about them."""
    assert main(["run", "Hi", "-m", "/nowhere/model-a", "-m", "/nowhere/model-b", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_report_written_from_records_tells_how_to_reproduce_the_records(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--report-only` and `--quiet` change how this call ran, not what it measured: a reader
    pasting the report's command must run the evaluation."""
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"output: {tmp_path / 'out'}\n"
        "tasks: [{task: arithmetic, seed: 0, problems: 2}]\n"
        "configurations: [{members: [smol], method: single}]\n"
    )
    assert main(["eval", "--config", str(config), "--report-only"]) == 2
    assert "holds no records of this evaluation" in capsys.readouterr().err  # before any model loads
    assert main(["eval", "--config", str(config), "--quiet"]) == 0
    assert main(["eval", "--config", str(config), "--report-only", "--quiet", "--no-plots"]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"Reproduce with: `ensemble-llm eval --config {config} --no-plots`" in report
    capsys.readouterr()
    assert main(["eval", "--config", str(config), "--rescore", "--no-plots"]) == 0
    assert "rescored 2 replies: 0 now correct, 0 now wrong, 0 with a new detail" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # rescoring writes the records: not a report-only call
        main(["eval", "--config", str(config), "--rescore", "--report-only"])


def _eval_config(argv):
    import argparse

    from ensemble_core.eval.command import add_arguments, config_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from(parser.parse_args(list(argv)))


def test_eval_compares_each_method_and_weighting_and_defaults_to_auto_weights() -> None:
    matrix = ["-m", "qwen", "-m", "smol", "--tasks", "arithmetic@2"]
    methods = ["--method", "single", "--method", "gac", "--method", "contrastive"]
    labels = [
        spec.label() for spec in _eval_config([*matrix, *methods, "--weights", "equal", "--weights", "auto"]).expanded()
    ]
    assert labels == ["qwen alone", "smol alone", "gac(qwen+smol)", "gac(qwen+smol) w=auto", "contrastive(qwen+smol)"]
    assert [spec.label() for spec in _eval_config([*matrix, "--method", "unite"]).expanded()] == [
        "unite(qwen+smol) w=auto"
    ]
    spans = _eval_config([*matrix, "--method", "sweetspan"])  # numbers only: equal, not an "auto" it refuses
    spans.check()
    assert [spec.label() for spec in spans.expanded()] == ["sweetspan(qwen+smol)"]
    numbers = _eval_config([*matrix, "--method", "gac", "--weights", "0.7,0.3"]).expanded()
    assert [spec.label() for spec in numbers] == ["gac(qwen+smol) w=0.7,0.3"]


def test_eval_method_params_are_the_methods_own_as_in_run_and_serve() -> None:
    matrix = ["-m", "qwen", "-m", "smol", "--tasks", "arithmetic@2", "--method-params", '{"drafter": "smol"}']
    (safe,) = _eval_config([*matrix, "--method", "safe"]).expanded()
    assert safe.method_params() == {"drafter": "smol", "weights": "auto"}
    with pytest.raises(ConfigError, match="drafter"):  # GaC has no drafter: named, not dropped
        _eval_config([*matrix, "--method", "gac"]).check()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            (
                "-m",
                "qwen",
                "-m",
                "smol",
                "--method",
                "gac",
                "--tasks",
                "arithmetic@2",
                "--method-params",
                '{"weights": "equal"}',
            ),
            "with --weights",
        ),
        (("-m", "qwen", "-m", "smol", "--method", "gac", "--tasks", "arithmetic@2", "--weights", "heavy"), "heavy"),
        (("--config", "examples/eval-smoke.yaml", "--weights", "auto"), "--weights would be ignored"),
        (("--config", "examples/eval-smoke.yaml", "--boundary", "retokenize"), "--boundary would be ignored"),
        (("--config", "examples/eval-smoke.yaml", "-m", "qwen"), "-m/--model would be ignored"),
    ],
)
def test_eval_flags_that_would_be_ignored_or_are_wrong_are_errors(argv, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _eval_config(argv)


def test_eval_and_calibrate_take_device_and_dtype_over_the_config() -> None:
    config = _eval_config(["--config", "examples/eval-smoke.yaml", "--device", "cpu", "--dtype", "float32"])
    assert (config.device, config.dtype) == ("cpu", "float32")
    bare = _eval_config(["-m", "qwen", "--method", "single", "--tasks", "arithmetic@2"])
    assert (bare.device, bare.dtype) == (None, "auto")  # as run and serve: the first GPU, the checkpoint's


def _options(parser) -> dict[str, str]:
    return {option: action.help for action in parser._actions for option in action.option_strings}


def test_every_command_spells_the_shared_options_alike_and_helps_with_every_option() -> None:
    from ensemble_core.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    shared = {"-m", "--method", "--method-params", "--weights", "--device", "--dtype"}
    for name in ("run", "serve", "eval"):
        options = _options(commands[name])
        assert shared <= set(options), name
        assert options["--device"] == _options(commands["run"])["--device"]
    assert {"--weights", "--device", "--dtype"} <= set(_options(commands["calibrate"]))
    for name, parser in commands.items():
        missing = [option for option, help_text in _options(parser).items() if not help_text]
        assert not missing, f"{name}: {missing} have no help"


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    import ensemble_core

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"ensemble-llm {ensemble_core.__version__}"
    assert ensemble_core.__version__ == version("ensemble-llm")
