"""`HFMember`: a local Hugging Face causal LM (packaged name, hub id or folder) as a member."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ensemble_core import packaged
from ensemble_core.chat.templates import chat_end_token_ids
from ensemble_core.devices import resolve_device, resolve_dtype
from ensemble_core.errors import ClosedError, ConfigError, ModelLoadError
from ensemble_core.members.base import TokenizerMember
from ensemble_core.members.hf_backend import HFBackend, cache_keyword, check_attention
from ensemble_core.members.lanes import check_num_threads
from ensemble_core.members.loaded import load_key, shared_model, shared_tokenizer
from ensemble_core.members.session import DEFAULT_TAIL_TOKENS
from ensemble_core.members.token_tree import Backend

# Special tokens that mean "end of text" in the families we know. A tokenizer gets these as
# extra end ids only when it has them AS SPECIAL TOKENS (data, not a model-name check):
# e.g. Qwen's `<|endoftext|>`, which its generation config lists beside `<|im_end|>`.
END_TOKEN_STRINGS = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
    "<eos>",
)


_SCORE_CHUNK = 256  # positions per forward when scoring a text


def _as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def collect_eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a sequence: generation config, tokenizer, chat-turn end, known end tokens."""
    ids = _as_id_set(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    ids |= _as_id_set(getattr(model.config, "eos_token_id", None))
    ids |= _as_id_set(getattr(tokenizer, "eos_token_id", None))
    ids |= chat_end_token_ids(tokenizer)
    special = {t.content: i for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items() if t.special}
    ids |= {special[s] for s in END_TOKEN_STRINGS if s in special}
    return frozenset(ids)


def _source_folder(name_or_path: str) -> str | Path:
    """A packaged name -> its prepared folder; anything else is passed to transformers as is."""
    if name_or_path in packaged.PACKAGED_MODELS:
        return packaged.model_path(name_or_path)
    return name_or_path


def config_context_window(config: Any) -> int:
    """Positions the model was built for, from its config (0 when the config does not say)."""
    return int(getattr(config.get_text_config(), "max_position_embeddings", 0) or 0)


def stated_context_window(name_or_path: str) -> int:
    """A model's context window read from its config alone: no weights are loaded.

    Raises:
        ModelLoadError: no config could be read for `name_or_path`.
    """
    folder = _source_folder(name_or_path)
    from transformers import AutoConfig

    try:
        return config_context_window(AutoConfig.from_pretrained(folder))
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"Could not read the config of {name_or_path!r}: {error}") from error


def checked_member_name(name_or_path: str, name: str | None) -> str:
    """The name a member loaded from `name_or_path` goes by (its last path part unless `name`
    is given), after checking the source is a usable string: every loader (local or hosted)
    names members the same way, so configs and results read alike whichever runs the model.

    Raises:
        ConfigError: `name_or_path` is not a non-empty string.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError(f"`name_or_path` must be a non-empty string, but is {name_or_path!r}.")
    return name or Path(name_or_path.rstrip("/")).name or name_or_path


class HFMember(TokenizerMember):
    """A Hugging Face causal LM with its tokenizer, ready to take part in an ensemble.

    Build it with `HFMember.from_pretrained(...)`, or wrap an already loaded model and
    tokenizer with `HFMember(model, tokenizer, name=...)` (two members may share one model:
    give them different names).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        name: str,
        *,
        tail_tokens: int = DEFAULT_TAIL_TOKENS,
        num_threads: int | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"`name` must be a non-empty string, but is {name!r}.")
        if isinstance(tail_tokens, bool) or not isinstance(tail_tokens, int) or tail_tokens < 1:
            raise ConfigError(f"`tail_tokens` has to be a positive integer, but is {tail_tokens!r}.")
        self.num_threads = check_num_threads(num_threads)
        check_attention(model)
        self.model: torch.nn.Module | None = model.eval()
        eos = collect_eos_ids(model, tokenizer)
        width = int(model.get_output_embeddings().weight.shape[0])
        super().__init__(tokenizer, name, eos, width, next(model.parameters()).device, tail_tokens)
        self.context_window = config_context_window(model.config)
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None else min(self.eos_token_ids, default=0)

    @property
    def device(self) -> torch.device:
        return self.vocab.device

    def _backend(self) -> Backend:
        if self.model is None:
            raise ClosedError(f"Member {self.name!r} was closed; load it again to use it.")
        return HFBackend(self.model, pad_token_id=self._pad_id)

    def _next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        """The model's own forward (soft-capping and all), over the cache in chunks, so a long
        text never holds more than one chunk of vocabulary-wide logits."""
        if self.model is None:
            raise ClosedError(f"Member {self.name!r} was closed; load it again to use it.")
        from transformers import DynamicCache

        tokens = torch.tensor([ids], device=self.device)
        cache = DynamicCache()
        keyword = cache_keyword(self.model)
        found = []
        with torch.inference_mode():
            for start in range(0, len(ids) - 1, _SCORE_CHUNK):
                piece = tokens[:, start : min(start + _SCORE_CHUNK, len(ids) - 1)]
                logits = self.model(input_ids=piece, use_cache=True, **{keyword: cache}).logits[0].float()
                targets = tokens[0, start + 1 : start + 1 + piece.shape[1]]
                found.append(torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0])
        return torch.cat(found).cpu()

    def close(self) -> None:
        """Drop this member's reference to the model (its memory is freed once nothing else holds it)."""
        super().close()
        self.model = None

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        name: str | None = None,
        chat_template: str | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        num_threads: int | None = None,
    ) -> HFMember:
        """Load a member from a packaged name, a Hugging Face Hub id or a local folder.

        A model already loaded in this process with the same source, dtype, device and
        `model_kwargs` (and still held by a member) is shared, not loaded again: two members of
        one checkpoint cost one copy of its weights (see `ensemble_core.members.loaded`).

        Args:
            name_or_path: e.g. "qwen2.5-coder-0.5b-instruct" (packaged, see
                `ensemble-llm models list`), "HuggingFaceTB/SmolLM2-135M-Instruct" or "./my-model".
            device: "cpu", "cuda", "cuda:1", ...; default: the first GPU if any, else the CPU.
            dtype: "auto" (the checkpoint's), "bfloat16", "float16", "float32" or a torch.dtype.
            name: how methods and results refer to this member (default: the last path part).
            chat_template: a Jinja chat template for models that lack one.
            model_kwargs: passed on to `AutoModelForCausalLM.from_pretrained` (e.g. attn_implementation).
            num_threads: a CPU member's own thread budget: it then steps in a lane of its own,
                concurrently with the other members (e.g. two members with 1 thread each on 2
                cores). None: it shares the calling thread and the process's threads.

        Raises:
            ConfigError: bad device/dtype (checked before any file is read).
            UnknownNameError / MissingPackageError: see `ensemble_core.packaged`.
            ModelLoadError: transformers could not load the model or tokenizer.
        """
        member_name = checked_member_name(name_or_path, name)
        target_device = resolve_device(device)
        check_num_threads(num_threads)
        torch_dtype = resolve_dtype(dtype)
        folder = _source_folder(name_or_path)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        options = {"attn_implementation": "sdpa", **dict(model_kwargs or {})}

        def load_tokenizer() -> Any:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            if chat_template is not None:
                tokenizer.chat_template = chat_template
            return tokenizer

        def load_model() -> torch.nn.Module:
            return AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, **options).to(target_device)

        source = str(folder)
        try:
            # members loaded alike share one copy (members/loaded.py)
            tokenizer = shared_tokenizer(load_key(source=source, chat_template=chat_template), load_tokenizer)
            model_key = load_key(source=source, dtype=torch_dtype, device=target_device, options=options)
            model = shared_model(model_key, load_model)
        except (OSError, ValueError, KeyError, ImportError) as error:
            raise ModelLoadError(
                f"Could not load {name_or_path!r} as a Hugging Face causal LM: {error}\n"
                "Pass a packaged name (see `ensemble-llm models list`), a local folder with config.json, "
                "or a Hub id that is in your Hugging Face cache when offline."
            ) from error
        return cls(model, tokenizer, member_name, num_threads=num_threads)
