"""One chat call as the framework adapters put it to an ensemble."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatRequest:
    """What the core is asked for, and what reading the reply needs to know.

    Attributes:
        prompt: the conversation as the core's message dicts.
        settings: checked generation settings (`max_new_tokens`, `stop`, ...), stops for tools included.
        tools: OpenAI-style tool dicts offered to the members, or None.
        reply_prefix: the start of the reply the members are made to continue (a forced call's
            opening, or a JSON object's); the reply is parsed as `reply_prefix + result.text`.
    """

    prompt: list[dict[str, Any]]
    settings: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    reply_prefix: str = ""

    @property
    def tool_names(self) -> list[str] | None:
        """The offered tools' names (None: no tools, so a call in the reply is reported invalid)."""
        return [t["function"]["name"] for t in self.tools] if self.tools else None

    @property
    def core_arguments(self) -> dict[str, Any]:
        """Keyword arguments for `Ensemble.generate`/`stream`/`agenerate`/`astream`."""
        return {"tools": self.tools, "reply_prefix": self.reply_prefix, **self.settings}
