"""The `ensemble-llm` command."""

from __future__ import annotations

import pytest

from ensemble_core.cli import main


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
