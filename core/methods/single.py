"""`Single`: one member decodes alone. The baseline every ensemble is compared with."""

from __future__ import annotations

from collections.abc import Sequence

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.methods.base import Commit, DecodeState, Method, MethodRun, member_index, register, token_commit
from ensemble_core.sampling import choose_token


@register("single")
class Single(Method):
    """Decode with one member only, through the same loop, cache and stop handling as ensembles.

    Greedy output equals `model.generate(do_sample=False)` token for token.

    Args:
        member: the member's name; default: the first member.

    Example:
        >>> Ensemble([qwen, smol], method=Single(member="smollm2-135m-instruct"))  # doctest: +SKIP
    """

    def __init__(self, member: str | None = None):
        if member is not None and (not isinstance(member, str) or not member):
            raise ConfigError(f"`member` must be a member name or None, but is {member!r}.")
        self.member = member
        self._index = 0

    def bind(self, members: Sequence[Member]) -> None:
        self._index = 0 if self.member is None else member_index(members, self.member, "member")

    def participants(self, members: Sequence[Member]) -> list[int]:
        return [self._index]

    def reference_member(self, members: Sequence[Member]) -> int:
        return self._index

    def start(self, members: Sequence[Member], settings: GenerationSettings) -> MethodRun:
        return _SingleRun(self._index, members[self._index], settings)

    def __repr__(self) -> str:
        return f"Single(member={self.member!r})"


class _SingleRun(MethodRun):
    def __init__(self, index: int, member: Member, settings: GenerationSettings):
        self._index = index
        self._member = member
        self._settings = settings

    def step(self, state: DecodeState) -> list[Commit]:
        logits = state.sessions[self._index].next_logits()
        return [
            token_commit(self._member, self._index, choose_token(logits[row], self._settings, state.generators[row]))
            for row in range(state.rows)
        ]
