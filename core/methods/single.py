"""`Single`: one member decodes alone. The baseline every ensemble is compared with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.constraints import Constraint
from ensemble_core.constraints.matcher import ConstraintState
from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import Continuations, MemberVocab, RequestId
from ensemble_core.members.own_choice import own_choice
from ensemble_core.methods.base import Binding, Commit, DecodeState, Method, MethodRun, register, role_index
from ensemble_core.methods.combine import Combiner
from ensemble_core.methods.token import allowed_choice, union_for
from ensemble_core.results import MethodStats
from ensemble_core.vocab.union import EOS_INDEX


@register("single")
@dataclass(frozen=True)
class Single(Method):
    """Decode with one member only, through the same loop, cache and stop handling as ensembles.

    With `Ensemble(..., boundary="retokenize")` greedy output equals
    `model.generate(do_sample=False)` token for token; with the default boundary correction the
    member may also re-read the unstable end of a raw prompt (docs/explanation/prompt-boundary.md).

    Args:
        member: the member's name (or a unique prefix); default: the first member.

    Example:
        >>> Ensemble([qwen, smol], method=Single(member="smollm2-135m-instruct"))  # doctest: +SKIP
    """

    constraint_refusal = None  # its own choice when the grammar allows it, else the best allowed text

    member: str | None = None

    def __post_init__(self) -> None:
        if self.member is not None and (not isinstance(self.member, str) or not self.member):
            raise ConfigError(f"`member` must be a member name or None, but is {self.member!r}.")

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        index = role_index(members, self.member, "member")
        weights = tuple(1.0 if i == index else 0.0 for i in range(len(members)))
        return Binding(self, tuple(members), (index,), index, weights, {"member": index})

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        return _SingleRun(binding.reference, binding.members[binding.reference], device)


@dataclass
class SingleStats(MethodStats):
    """`Single`'s figures: `steps` (tokens chosen)."""

    steps: int = 0

    @property
    def share_ensembled(self) -> float | None:
        return 0.0


class _SingleRun(MethodRun):
    def __init__(self, index: int, vocab: MemberVocab, device: torch.device):
        self._index = index
        self._vocab = vocab
        self._device = device
        self._stats: dict[RequestId, SingleStats] = {}
        self._alone: Combiner | None = None

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
            constraint = state.constraints.get(request)
            if not allowed_choice(constraint, choice):
                commits[request] = self._allowed(state, request, distribution, constraint)
                continue
            if choice.eos:
                commits[request] = Commit(eos=True)
                continue
            session.write(request, distribution, choice.pick)
            commits[request] = Commit(text=choice.text)
        return commits

    def _allowed(
        self, state: DecodeState, request: RequestId, distribution: Continuations, constraint: ConstraintState
    ) -> Commit:
        """The grammar refused the member's choice: choose again among the texts it allows, from the
        same distribution (greedy: the most likely allowed; sampled: the distribution renormalised
        over them, which is what a refused sample followed by this draw amounts to)."""
        step = self._combiner().step({0: distribution}, None, constraint)
        if state.settings.greedy:
            entry, _ = step.greedy()
        else:
            entry = step.choose(step.full_scored(), state.settings, state.generators.get(request))
        if entry == EOS_INDEX:
            return Commit(eos=True)
        pick = step.pick_for(0, entry)
        if pick is not None:  # else a part of one of its tokens: it reads the text back at the next step
            state.sessions[self._index].write(request, distribution, pick)
        return Commit(text=step.text(entry))

    def _combiner(self) -> Combiner:
        """The member's texts as one-member union entries, made on the first constrained request."""
        if self._alone is None:
            self._alone = Combiner(union_for([self._vocab]), [self._vocab], [1.0], self._device)
        return self._alone

    def constrain(self, constraint: Constraint) -> ConstraintState:
        return ConstraintState(constraint, self._combiner().union)

    def stats(self, request: RequestId) -> MethodStats:
        return self._stats.get(request, SingleStats())

    def drop(self, requests: Sequence[RequestId]) -> None:
        for request in requests:
            self._stats.pop(request, None)
