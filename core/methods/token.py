"""Token-level ensembles across tokenizers: GaC (with the key-token gate) and UniTE, and the
every-step machinery contrastive decoding (`methods.contrast`) shares with them.

GaC and UniTE combine the members' next-step distributions at each step (docs/explanation/methods.md#gac, #unite) and
commit the chosen text; every member then brings itself in step with it. A member whose own
choice is the chosen text writes it itself (keeps its own tokens), so two copies of one model,
or weights (1, 0), reproduce that model exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.constraints import Constraint
from ensemble_core.constraints.matcher import ConstraintState
from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import Continuations, MemberVocab, RequestId
from ensemble_core.members.own_choice import Choice, greedy_choice, own_choice
from ensemble_core.methods.base import (
    Binding,
    Commit,
    DecodeState,
    Method,
    MethodRun,
    bind_all,
    check_fraction,
    check_positive_int,
    check_weights,
    register,
    require_some,
    role_index,
)
from ensemble_core.methods.combine import Combiner, Step
from ensemble_core.methods.weighting import RequestWeights, WeightRule, named_weights
from ensemble_core.results import MethodStats
from ensemble_core.vocab.union import EOS_INDEX, UnionVocab, build_union


def union_for(members: Sequence[MemberVocab]) -> UnionVocab:
    """The (shared) union vocabulary of these members."""
    return build_union([m.table for m in members], [m.eos_ids for m in members], [m.width for m in members])


def bound_union(binding: Binding) -> UnionVocab:
    """The binding's union, built on first use and kept for the ensemble's life."""
    if "union" not in binding.cache:
        binding.cache["union"] = union_for(binding.members)
    return binding.cache["union"]


@dataclass
class TokenStats(MethodStats):
    """GaC's, UniTE's and contrastive decoding's figures for one prompt.

    Attributes:
        steps: tokens committed.
        ensembled_steps: steps decided by several members (all of them without the gate).
        shortcut_steps: greedy GaC steps the exact top-k shortcut decided (no full union).
        union_size: entries of the members' union vocabulary.
        weights: the member weights of the last ensembled step, by member name (empty for
            contrastive decoding, which does not weigh its members).
    """

    steps: int = 0
    ensembled_steps: int = 0
    shortcut_steps: int = 0
    union_size: int = 0
    weights: dict[str, float] = field(default_factory=dict)

    @property
    def share_ensembled(self) -> float | None:
        return self.ensembled_steps / self.steps if self.steps else 0.0

    @property
    def shortcut_share(self) -> float:
        return self.shortcut_steps / self.ensembled_steps if self.ensembled_steps else 0.0


class TokenMethod(Method):
    """Shared machinery of the every-step token methods: gate, union, the run."""

    constraint_refusal = None  # every decision is a step's choice among texts: the allowed ones

    def reference(self, members: Sequence[MemberVocab]) -> int:
        return 0

    def gate(self, binding: Binding) -> tuple[int, float] | None:
        """(primary member, threshold) when the key-token gate is on."""
        return None

    def decide(self, step: Step, state: DecodeState, request: RequestId, stats: TokenStats) -> int:
        """The entry to commit at an ensembled step."""
        raise NotImplementedError

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        combiner = Combiner(bound_union(binding), binding.members, binding.weights, device)
        return _TokenRun(self, binding, combiner, RequestWeights(binding.weights, binding.rule))


class WeightedTokenMethod(TokenMethod):
    """A token method that averages its members with weights (numbers or a rule that finds them)."""

    finds_weights: ClassVar[bool] = True
    weights: tuple[float, ...] | WeightRule | None

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        return bind_all(self, members, self.weights, reference=self.reference(members))


@register("gac")
@dataclass(frozen=True)
class GaC(WeightedTokenMethod):
    """Generation as Classification: average the members' distributions at every step and take
    the argmax (or sample from it when temperature > 0).

    Args:
        weights: one per member (normalised); default equal; or "auto" / "prompt" / "agreement"
            (per-request weights that need no tuning, see `methods.weighting`).
        threshold: turn on the key-token gate: when the primary's top probability is above
            it, the primary's token is taken without consulting the others (they catch up at
            the next ensembled step in ONE forward). In (0, 1]; the SAFE paper uses 0.5.
        primary: the gate's primary member (name or unique prefix); default the first.

    Example:
        >>> Ensemble([qwen, smol], method=GaC(threshold=0.5, primary="qwen"))  # doctest: +SKIP
    """

    weights: tuple[float, ...] | None = None
    threshold: float | None = None
    primary: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", check_weights(self.weights))
        if self.threshold is not None:
            value = check_fraction(self.threshold, "threshold", 0.0, 1.0, low_open=True, high_open=False)
            object.__setattr__(self, "threshold", value)
        if self.primary is not None and self.threshold is None:
            raise ConfigError("`primary` only applies with a `threshold` (the key-token gate); set both.")

    def reference(self, members: Sequence[MemberVocab]) -> int:
        return role_index(members, self.primary, "primary")

    def gate(self, binding: Binding) -> tuple[int, float] | None:
        return None if self.threshold is None else (binding.reference, self.threshold)

    def decide(self, step: Step, state: DecodeState, request: RequestId, stats: TokenStats) -> int:
        if state.settings.greedy:
            entry, by_shortcut = step.greedy()
            stats.shortcut_steps += by_shortcut
            return entry
        return step.choose(step.full_scored(), state.settings, state.generators.get(request))


@register("unite")
@dataclass(frozen=True)
class UniTE(WeightedTokenMethod):
    """UniTE: only the union of each member's top-k candidates is considered; each member's
    distribution is restricted to that set and renormalised (a candidate a member lacks is
    scored through its first sub-token), averaged, argmax or sampled.

    Args:
        top_k: candidates per member (the paper's k = 10); a positive integer.
        weights: one per member (normalised); default equal; or "auto" / "prompt" / "agreement"
            (per-request weights that need no tuning, see `methods.weighting`).
    """

    top_k: int = 10
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_positive_int(self.top_k, "top_k")
        object.__setattr__(self, "weights", check_weights(self.weights))

    def decide(self, step: Step, state: DecodeState, request: RequestId, stats: TokenStats) -> int:
        scored = step.unite(self.top_k, first_token_of(state))
        return step.choose(scored, state.settings, state.generators.get(request))


def first_token_of(state: DecodeState):
    """UniTE's lookup for a candidate a member lacks: the member's first token of that text."""

    def first_token(member: int, text: bytes) -> int | None:
        ids = state.members[member].encode(text)
        return ids[0] if ids else None

    return first_token


@dataclass
class _TokenRun(MethodRun):
    method: TokenMethod
    binding: Binding
    combiner: Combiner
    weights: RequestWeights
    counts: dict[RequestId, TokenStats] = field(default_factory=dict)

    def step(self, state: DecodeState) -> dict[RequestId, Commit]:
        commits: dict[RequestId, Commit] = {}
        to_ensemble = list(state.requests)
        gate = self.method.gate(self.binding)
        primary_found: dict[RequestId, Continuations | None] = {}
        if gate is not None:
            to_ensemble, primary_found = self._gated(state, gate, commits)
        if to_ensemble:
            found = state.next_of_each([m for m in state.sessions if m not in self._already(gate)], to_ensemble)
            if gate is not None:
                found[gate[0]] = primary_found
            for request in to_ensemble:
                distributions = require_some({m: per[request] for m, per in found.items()}, request)
                commits[request] = self._ensembled(state, request, distributions)
        for request in state.requests:
            self._stats(request).steps += 1
        return commits

    @staticmethod
    def _already(gate: tuple[int, float] | None) -> set[int]:
        return set() if gate is None else {gate[0]}

    def _stats(self, request: RequestId) -> TokenStats:
        if request not in self.counts:
            self.counts[request] = TokenStats(union_size=self.combiner.union.size)
        return self.counts[request]

    def _gated(
        self, state: DecodeState, gate: tuple[int, float], commits: dict[RequestId, Commit]
    ) -> tuple[list[RequestId], dict[RequestId, Continuations | None]]:
        primary, threshold = gate
        vocab = state.members[primary]
        found = state.next_of(primary, state.requests)
        rest = []
        for request in state.requests:
            distribution = found[request]
            greedy = None if distribution is None else greedy_choice(vocab, distribution)
            if greedy is None or not greedy.prob > threshold:  # its top probability, at temperature 1 when greedy
                rest.append(request)
                continue
            generator = state.generators.get(request)
            choice = greedy if generator is None else own_choice(vocab, distribution, state.settings, generator)
            if not allowed_choice(state.constraints.get(request), choice):
                rest.append(request)  # the grammar rejects the primary's text: the ensemble decides
                continue
            if choice.eos:
                commits[request] = Commit(eos=True)
            else:
                state.sessions[primary].write(request, distribution, choice.pick)
                commits[request] = Commit(text=choice.text)
        return rest, {r: found[r] for r in rest}

    def _ensembled(self, state: DecodeState, request: RequestId, distributions: dict[int, Continuations]) -> Commit:
        weights = self.weights.of(request, state.weights.get(request))
        step = self.combiner.step(distributions, weights, state.constraints.get(request))
        stats = self._stats(request)
        stats.ensembled_steps += 1
        entry = self.method.decide(step, state, request, stats)
        self.weights.observe(request, lambda: step.probabilities_of(entry))
        if isinstance(self.method, WeightedTokenMethod):
            stats.weights = named_weights(state.members, step.weights)
        if entry == EOS_INDEX:
            return Commit(eos=True)
        for member, distribution in distributions.items():
            pick = step.pick_for(member, entry)
            if pick is not None:  # this member's own choice: it keeps its own tokens
                state.sessions[member].write(request, distribution, pick)
        return Commit(text=step.text(entry))

    def stats(self, request: RequestId) -> MethodStats:
        return self._stats(request)

    def constrain(self, constraint: Constraint) -> ConstraintState:
        return ConstraintState(constraint, self.combiner.union)


def allowed_choice(constraint: ConstraintState | None, choice: Choice) -> bool:
    """Whether a member's own choice may be committed under the request's constraint."""
    if constraint is None:
        return True
    if choice.eos:
        return constraint.allows_end()
    return not choice.control and constraint.allows(choice.text)

    def drop(self, requests: Sequence[RequestId]) -> None:
        for request in requests:
            self.counts.pop(request, None)
        self.weights.drop(requests)
