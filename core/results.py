"""What a generation returns: text, why it ended, token usage and method statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "eos"]


@dataclass(frozen=True)
class MemberUsage:
    """Tokens one member spent, in ITS OWN tokens (tokenizers differ, so counts differ).

    Attributes:
        prompt_tokens: the member's rendered prompt (chat template included).
        completion_tokens: the member's ids for the generated text, plus one for an EOS.
    """

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Usage:
    """Token counts: a headline figure plus every member's own.

    The headline (`prompt_tokens`, `completion_tokens`) is counted in the tokens of
    `counted_by`, the method's reference member (the only member for `Single`, the
    primary or drafter for selective methods, else the first member).
    """

    prompt_tokens: int
    completion_tokens: int
    counted_by: str
    members: dict[str, MemberUsage] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class MemberStats:
    """Work one member did (for the whole batch the result was generated in).

    Attributes:
        forwards: model forward passes.
        forward_seconds: wall seconds inside those forwards.
        forwarded_tokens: positions fed through the model (padding included).
        own_tokens: committed tokens this member itself proposed (kept without re-encoding).
        reencoded_tokens: tokens it took from re-encoding committed text it did not propose.
        rollbacks: times it had to crop its cache because committed text diverged from its ids.
    """

    forwards: int
    forward_seconds: float
    forwarded_tokens: int
    own_tokens: int
    reencoded_tokens: int
    rollbacks: int


@dataclass(frozen=True)
class GenerationStats:
    """How the text was made.

    Attributes:
        method: the method's registry name ("single", ...).
        steps: commits made for this prompt (each counts toward `max_new_tokens`).
        wall_seconds: from the start of the call to this prompt's end.
        members: per member name, `MemberStats`.
        method_stats: method-specific figures (documented by each method).
    """

    method: str
    steps: int
    wall_seconds: float
    members: dict[str, MemberStats]
    method_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.steps / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass(frozen=True)
class GenerationResult:
    """One prompt's generation.

    Attributes:
        text: the generated text (stop string excluded; invalid UTF-8 shown as U+FFFD).
        finish_reason: "stop" (a stop string), "length" (max_new_tokens) or "eos".
        usage: token counts (`Usage`).
        stats: `GenerationStats`.
        data: the committed bytes behind `text`, exactly (stop string excluded).
        token_ids: per member name, its own ids for the generated text (EOS not included;
            a stop string's tokens are, since the member generated them).
    """

    text: str
    finish_reason: FinishReason
    usage: Usage
    stats: GenerationStats
    data: bytes = b""
    token_ids: dict[str, list[int]] = field(default_factory=dict)

    def api_finish_reason(self, called_tools: bool) -> str:
        """The finish reason in the words chat APIs use: "tool_calls", "length" or "stop"
        (an end-of-sequence token and a stop string both end the reply as asked)."""
        if called_tools:
            return "tool_calls"
        return "length" if self.finish_reason == "length" else "stop"

    def summary(self) -> dict[str, Any]:
        """How the answer was made, as plain JSON values, for frameworks' response metadata.

        Keys: `method`; `share_ensembled` (tokens decided by several members, when the method
        reports it); `winners` (rounds won per member, span/segment methods); `steps`;
        `wall_seconds`; `member_seconds` (forward seconds per member); `member_usage`
        (prompt/completion tokens per member, in its own tokens); `method_stats` (all of the
        method's figures).
        """
        rounds = self.stats.method_stats.get("per_round") or []
        winners: dict[str, int] = {}
        for round_stats in rounds:
            for name in _as_names(round_stats.get("winner")):
                winners[name] = winners.get(name, 0) + 1
        return {
            "method": self.stats.method,
            "share_ensembled": self.stats.method_stats.get("share_ensembled"),
            "winners": winners,
            "steps": self.stats.steps,
            "wall_seconds": round(self.stats.wall_seconds, 4),
            "member_seconds": {name: round(s.forward_seconds, 4) for name, s in self.stats.members.items()},
            "member_usage": {
                name: {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
                for name, u in self.usage.members.items()
            },
            "method_stats": self.stats.method_stats,
        }


def _as_names(winner: Any) -> list[str]:
    if isinstance(winner, str):
        return [winner]
    return [w for w in winner or () if isinstance(w, str)]


@dataclass(frozen=True)
class StreamChunk:
    """A piece of streamed text; the last chunk of a prompt carries `finish_reason` and `result`.

    Concatenating the `text` of every chunk gives `result.text`.
    """

    text: str
    index: int = 0
    finish_reason: FinishReason | None = None
    result: GenerationResult | None = None
