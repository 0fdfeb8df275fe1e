"""What a generation returns: text, why it ended, token usage and method statistics."""

from __future__ import annotations

import dataclasses
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

    def headline(self) -> dict[str, int]:
        """The headline counts under the names chat APIs use (prompt, completion, total tokens)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(frozen=True)
class MemberStats:
    """Work one member did (for the whole batch the result was generated in).

    Attributes:
        forwards: model forward passes.
        forward_seconds: wall seconds inside those forwards.
        forwarded_tokens: positions fed through the model (padding included).
        own_tokens: committed tokens this member wrote itself (kept without re-encoding).
        reencoded_tokens: tokens it took from encoding committed text it did not write.
        rollbacks: times committed text disagreed with ids it had already forwarded.
        sat_out: steps it could not take part in (it could not spell the committed text).
        unspellable: commits that brought bytes it has no tokens for (it sits out from there
            to the end of that reply, and a warning says so once).
    """

    forwards: int
    forward_seconds: float
    forwarded_tokens: int
    own_tokens: int
    reencoded_tokens: int
    rollbacks: int
    sat_out: int = 0
    unspellable: int = 0


@dataclass
class MethodStats:
    """A method's figures for one request; each method documents its own subclass.

    Every subclass answers `share_ensembled` (the share of committed tokens several members
    decided; None when the notion does not apply) and `winners` (rounds won per member name,
    for span and segment methods).
    """

    @property
    def share_ensembled(self) -> float | None:
        return None

    def winners(self) -> dict[str, int]:
        return {}

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values (for frameworks' response metadata)."""
        values = dataclasses.asdict(self)
        values["share_ensembled"] = self.share_ensembled
        return values


@dataclass(frozen=True)
class GenerationStats:
    """How the text was made.

    Attributes:
        method: the method's registry name ("single", ...).
        steps: commits made for this prompt (each counts toward `max_new_tokens`).
        wall_seconds: from the start of the call to this prompt's end.
        members: per member name, `MemberStats`.
        method_stats: the method's figures for this prompt (a `MethodStats` subclass
            documented by each method).
    """

    method: str
    steps: int
    wall_seconds: float
    members: dict[str, MemberStats]
    method_stats: MethodStats = field(default_factory=MethodStats)

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
            a stop string's tokens are, since the member generated them). With prompt-boundary
            correction a member may re-tokenise the unstable end of a raw prompt together
            with the reply: its ids then start where its ids first differ from its prompt ids.
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
        method_stats = self.stats.method_stats
        return {
            "method": self.stats.method,
            "share_ensembled": method_stats.share_ensembled,
            "winners": method_stats.winners(),
            "steps": self.stats.steps,
            "wall_seconds": round(self.stats.wall_seconds, 4),
            "member_seconds": {name: round(s.forward_seconds, 4) for name, s in self.stats.members.items()},
            "member_usage": {
                name: {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
                for name, u in self.usage.members.items()
            },
            "method_stats": method_stats.as_dict(),
        }


@dataclass(frozen=True)
class StreamChunk:
    """A piece of streamed text; the last chunk of a prompt carries `finish_reason` and `result`.

    Concatenating the `text` of every chunk gives `result.text`.
    """

    text: str
    index: int = 0
    finish_reason: FinishReason | None = None
    result: GenerationResult | None = None
