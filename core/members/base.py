"""What every ensemble member offers, whatever runs the model.

A `Member` renders prompts in its own format, states its static facts (`MemberVocab`: name,
token bytes, end ids, logits width, device), and opens sessions (`contract.MemberSession`),
the only thing methods touch. `TokenizerMember` is the common base of members that read text
with a Hugging Face tokenizer and evaluate token tries (`HFMember`, `testing.FakeMember`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ensemble_core.chat.templates import Prompt, Tools, render_prompt
from ensemble_core.errors import ClosedError
from ensemble_core.members.contract import Boundary, MemberSession, MemberVocab, RenderedPrompt, RequestId
from ensemble_core.members.encoding import ExactEncoder
from ensemble_core.members.session import DEFAULT_TAIL_TOKENS, TreeSession
from ensemble_core.members.token_tree import Backend, TokenTree
from ensemble_core.vocab.tokens import TokenTable, token_table


@dataclass(frozen=True)
class TextScore:
    """How likely a member finds a text: `logprob` (natural log, summed over the tokens it
    scored) and `scored_bytes` (the bytes those tokens spell), so members with different
    tokenizers compare per byte."""

    logprob: float
    scored_bytes: int

    @property
    def per_byte(self) -> float | None:
        return self.logprob / self.scored_bytes if self.scored_bytes else None


class Member(ABC):
    """One model behind the interface methods use."""

    name: str
    context_window: int = 0
    num_threads: int | None = None
    """Intra-op threads of the member's own CPU lane (None: it runs in the calling thread;
    see `members.lanes`)."""
    remote: bool = False
    """Whether its model runs elsewhere (another process or node): its calls get a lane of their own."""

    @property
    @abstractmethod
    def vocab(self) -> MemberVocab:
        """The member's static facts."""

    @abstractmethod
    def render(self, prompt: Prompt, tools: Tools = None, reply_prefix: str = "") -> RenderedPrompt:
        """This member's prompt for a raw string or a conversation (+ tools, + the start of the reply)."""

    @abstractmethod
    def start(self, prompts: Mapping[RequestId, RenderedPrompt], boundary: Boundary) -> MemberSession:
        """A session over a batch of rendered prompts (nothing is forwarded yet)."""

    @abstractmethod
    def encode_text(self, text: str) -> list[int]:
        """The member's token ids for a text (what framework token counters ask for)."""

    @abstractmethod
    def text_logprob(self, texts: Sequence[str], max_bytes: int | None = None) -> list[TextScore]:
        """How likely the member finds each text as a raw text (after its BOS, if it uses one).

        The evidence behind prompt-based member weights (PackLLM): a member that predicts a
        prompt well knows its domain. `max_bytes` keeps only a text's last bytes (cost bound).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model (a closed member raises `ClosedError` when started)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class TokenizerMember(Member):
    """A member that reads text with a Hugging Face tokenizer and evaluates token tries.

    Subclasses provide the evaluation (`_backend`) and the static facts of the model.

    Args:
        tokenizer: the member's tokenizer.
        name: its unique name.
        eos_token_ids: ids that end a sequence.
        logits_width: the width of its next-token logits.
        device: where its logits live.
        tail_tokens: retokenize mode: how many of its last ids are re-encoded with new text.
    """

    def __init__(
        self,
        tokenizer: Any,
        name: str,
        eos_token_ids: frozenset[int],
        logits_width: int,
        device: torch.device,
        tail_tokens: int = DEFAULT_TAIL_TOKENS,
    ):
        self.tokenizer = tokenizer
        self.name = name
        self.table: TokenTable = token_table(tokenizer)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.logits_width = int(logits_width)
        self._encoder = ExactEncoder(tokenizer, self.table)
        self._tail_tokens = tail_tokens
        self._closed = False
        self._vocab = MemberVocab(
            name=name,
            table=self.table,
            eos_ids=self.eos_token_ids,
            width=self.logits_width,
            device=torch.device(device),
            encode=self._encoder.encode,
        )

    @property
    def vocab(self) -> MemberVocab:
        return self._vocab

    @property
    def token_bytes(self) -> list[bytes | None]:
        """The bytes each of this member's token ids spells (None: special); see `vocab`."""
        return self.table.token_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def render(self, prompt: Prompt, tools: Tools = None, reply_prefix: str = "") -> RenderedPrompt:
        return render_prompt(self.tokenizer, prompt, self.name, tools, reply_prefix)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def start(self, prompts: Mapping[RequestId, RenderedPrompt], boundary: Boundary) -> MemberSession:
        if self._closed:
            raise ClosedError(f"Member {self.name!r} was closed; load it again to use it.")
        tree = TokenTree(self._backend(), {key: prompt.ids for key, prompt in prompts.items()}, self.name)
        return TreeSession(
            self._vocab,
            tree,
            dict(prompts),
            self._encoder,
            boundary,
            self.end_token_id,
            self._tail_tokens,
            tokenizer=self.tokenizer,
        )

    @property
    def end_token_id(self) -> int:
        """The id that ends a candidate in scoring (the tokenizer's EOS when it is one of ours)."""
        preferred = getattr(self.tokenizer, "eos_token_id", None)
        return preferred if preferred in self.eos_token_ids else min(self.eos_token_ids)

    @abstractmethod
    def _backend(self) -> Backend:
        """A fresh evaluator for one session."""

    @abstractmethod
    def _next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        """float32 [len(ids) - 1]: log p(ids[t] | ids[:t]) for t = 1 .. len(ids) - 1."""

    def text_logprob(self, texts: Sequence[str], max_bytes: int | None = None) -> list[TextScore]:
        if self._closed:
            raise ClosedError(f"Member {self.name!r} was closed; load it again to use it.")
        found = []
        for text in texts:
            if max_bytes is not None and len(text.encode("utf-8")) > max_bytes:
                text = text.encode("utf-8")[-max_bytes:].decode("utf-8", errors="ignore")
            ids = self.render(text).ids
            if len(ids) < 2:
                found.append(TextScore(0.0, 0))
                continue
            logprobs = self._next_token_logprobs(ids)
            found.append(TextScore(float(logprobs.sum()), len(self.table.spell(ids[1:]))))
        return found

    def close(self) -> None:
        self._closed = True
