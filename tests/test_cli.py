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


def test_eval_lists_vary_weights_only_for_methods_that_have_them() -> None:
    import argparse

    from ensemble_core.eval.command import add_arguments, config_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--members",
            "qwen,smol",
            "--methods",
            "single,gac,contrastive",
            "--weights",
            "equal,auto",
            "--tasks",
            "arithmetic@2",
        ]
    )
    labels = [spec.label() for spec in config_from(args).expanded()]
    assert labels == ["qwen alone", "smol alone", "gac(qwen+smol)", "gac(qwen+smol) w=auto", "contrastive(qwen+smol)"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (  # serve's flat form: it would have been dropped, and SAFE run with its default drafter
            (
                "--members",
                "qwen,smol",
                "--methods",
                "safe",
                "--tasks",
                "arithmetic@2",
                "--method-params",
                '{"drafter": "smol"}',
            ),
            "has \\['drafter'\\], which are not among --methods \\['safe'\\]",
        ),
        (
            (
                "--members",
                "qwen,smol",
                "--methods",
                "gac",
                "--tasks",
                "arithmetic@2",
                "--method-params",
                '{"safe": {}}',
            ),
            "has \\['safe'\\], which are not among --methods",
        ),
        (("--config", "examples/eval-smoke.yaml", "--weights", "auto"), "--weights would be ignored"),
        (("--config", "examples/eval-smoke.yaml", "--boundary", "retokenize"), "--boundary would be ignored"),
    ],
)
def test_eval_flags_that_would_be_ignored_are_errors(argv, message) -> None:
    import argparse

    from ensemble_core.eval.command import add_arguments, config_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match=message):
        config_from(parser.parse_args(list(argv)))
