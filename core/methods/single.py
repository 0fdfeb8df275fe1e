"""`Single`: one member decodes alone. The baseline every ensemble is compared with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import MemberVocab, RequestId
from ensemble_core.members.own_choice import own_choice
from ensemble_core.methods.base import Binding, Commit, DecodeState, Method, MethodRun, register, role_index
from ensemble_core.results import MethodStats


@register("single")
@dataclass(frozen=True)
class Single(Method):
    """Decode with one member only, through the same loop, cache and stop handling as ensembles.

    With `Ensemble(..., boundary="retokenize")` greedy output equals
    `model.generate(do_sample=False)` token for token; with the default boundary correction the
    member may also re-read the unstable end of a raw prompt (ALGORITHMS.md 6a).

    Args:
        member: the member's name (or a unique prefix); default: the first member.

    Example:
        >>> Ensemble([qwen, smol], method=Single(member="smollm2-135m-instruct"))  # doctest: +SKIP
    """

    constraint_refusal = "a member alone takes its own choices, and filtering them by a grammar is not built yet"

    member: str | None = None

    def __post_init__(self) -> None:
        if self.member is not None and (not isinstance(self.member, str) or not self.member):
            raise ConfigError(f"`member` must be a member name or None, but is {self.member!r}.")

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        index = role_index(members, self.member, "member")
        weights = tuple(1.0 if i == index else 0.0 for i in range(len(members)))
        return Binding(self, tuple(members), (index,), index, weights, {"member": index})

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        return _SingleRun(binding.reference, binding.members[binding.reference])


@dataclass
class SingleStats(MethodStats):
    """`Single`'s figures: `steps` (tokens chosen)."""

    steps: int = 0

    @property
    def share_ensembled(self) -> float | None:
        return 0.0


class _SingleRun(MethodRun):
    def __init__(self, index: int, vocab: MemberVocab):
        self._index = index
        self._vocab = vocab
        self._stats: dict[RequestId, SingleStats] = {}

    def step(self, state: DecodeState) -> dict[RequestId, Commit]:
        found = state.next_of(self._index, state.requests)
        session = state.sessions[self._index]
        commits = {}
        for request in state.requests:
            distribution = found[request]
            if distribution is None:
                raise RuntimeError(f"member {self._vocab.name!r} cannot continue request {request}")
            choice = own_choice(self._vocab, distribution, state.settings, state.generators.get(request))
            self._stats.setdefault(request, SingleStats()).steps += 1
            if choice.eos:
                commits[request] = Commit(eos=True)
                continue
            session.write(request, distribution, choice.pick)
            commits[request] = Commit(text=choice.text)
        return commits

    def stats(self, request: RequestId) -> MethodStats:
        return self._stats.get(request, SingleStats())

    def drop(self, requests: Sequence[RequestId]) -> None:
        for request in requests:
            self._stats.pop(request, None)
