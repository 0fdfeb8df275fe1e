"""The one interface every ensemble member offers, whatever runs the model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ensemble_core.chat import Prompt, Tools
from ensemble_core.members.text_sync import MemberSession
from ensemble_core.vocab import TokenTable


class Member(ABC):
    """One model behind the interface methods use.

    A member renders prompts in its own format, knows which of its ids end a sequence, and
    opens a `MemberSession` (its KV cache for a batch of rows, kept in step with the
    committed text). Methods never touch a model directly.
    """

    name: str
    tokenizer: Any
    table: TokenTable
    eos_token_ids: frozenset[int]
    context_window: int
    logits_width: int

    @property
    def token_bytes(self) -> list[bytes | None]:
        """The bytes each of this member's token ids spells (None: special); see `vocab`."""
        return self.table.token_bytes

    @abstractmethod
    def render(self, prompt: Prompt, tools: Tools = None, reply_prefix: str = "") -> list[int]:
        """This member's prompt ids for a raw string or a conversation (+ tools, + the start of the reply)."""

    @abstractmethod
    def start(self, prompts: Sequence[Sequence[int]]) -> MemberSession:
        """A session over a batch of rendered prompts (nothing is forwarded yet)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
