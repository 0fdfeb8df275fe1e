"""Token-level ensembles across tokenizers: GaC (with the key-token gate) and UniTE.

Both combine the members' next-token distributions in the union vocabulary at each step
(ALGORITHMS.md sections 1-2) and commit the chosen entry's bytes; every member then brings its
own ids in step with the text. A member whose own top token is the chosen entry keeps that
id, so two copies of one model, or weights (1, 0), reproduce that model exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.members.text_sync import MemberSession
from ensemble_core.methods.base import (
    Commit,
    DecodeState,
    EnsembleMethod,
    MethodRun,
    in_step_members,
    member_index,
    register,
    token_commit,
)
from ensemble_core.methods.combine import Combiner, Scored, first_tokens_of
from ensemble_core.sampling import choose_token
from ensemble_core.union import EOS_INDEX, build_union


def union_for(members: Sequence[Member]):
    """The (memoised) union vocabulary of these members."""
    return build_union(
        [m.table for m in members], [m.eos_token_ids for m in members], [m.logits_width for m in members]
    )


class TokenMethod(EnsembleMethod):
    """Shared configuration of the every-step token methods: weights, gate, union."""

    def start(self, members: Sequence[Member], settings: GenerationSettings) -> MethodRun:
        return _TokenRun(self, members, Combiner(union_for(members), self.member_weights), settings)

    def gate(self) -> tuple[int, float] | None:
        """(primary member, threshold) when the key-token gate is on."""
        return None

    def decide(self, run: _TokenRun, probs: dict[int, torch.Tensor], generator: torch.Generator | None) -> int:
        """The union entry to commit at an ensembled step."""
        raise NotImplementedError


@register("gac")
class GaC(TokenMethod):
    """Generation as Classification: average the members' distributions over the union at
    every step and take the argmax (or sample from it when temperature > 0).

    Args:
        weights: one per member (normalised); default equal.
        threshold: turn on the key-token gate: when the primary's top probability is above
            it, the primary's token is taken without consulting the others (they catch up at
            the next ensembled step in ONE forward). In (0, 1]; the SAFE paper uses 0.5.
        primary: the gate's primary member (name or unique prefix); default the first.

    Example:
        >>> Ensemble([qwen, smol], method=GaC(threshold=0.5, primary="qwen"))  # doctest: +SKIP
    """

    def __init__(
        self, weights: Sequence[float] | None = None, threshold: float | None = None, primary: str | None = None
    ):
        super().__init__(weights)
        if threshold is not None and not 0.0 < float(threshold) <= 1.0:
            raise ConfigError(f"`threshold` has to be in (0, 1], but is {threshold}.")
        if primary is not None and threshold is None:
            raise ConfigError("`primary` only applies with a `threshold` (the key-token gate); set both.")
        self.threshold = None if threshold is None else float(threshold)
        self.primary = primary
        self._primary_index = 0

    def bind(self, members: Sequence[Member]) -> None:
        super().bind(members)
        self._primary_index = 0 if self.primary is None else member_index(members, self.primary, "primary")

    def reference_member(self, members: Sequence[Member]) -> int:
        return self._primary_index

    def gate(self) -> tuple[int, float] | None:
        return None if self.threshold is None else (self._primary_index, self.threshold)

    def decide(self, run: _TokenRun, probs: dict[int, torch.Tensor], generator: torch.Generator | None) -> int:
        if run.settings.greedy:
            entry, by_shortcut = run.combiner.greedy(probs)
            run.shortcut_hits += by_shortcut
            return entry
        full = Scored(torch.arange(run.combiner.union.size), run.combiner.full(probs))
        return run.combiner.choose(full, run.settings, generator, run.combiner.preferred(probs))

    def __repr__(self) -> str:
        return f"GaC(weights={self.weights}, threshold={self.threshold}, primary={self.primary!r})"


@register("unite")
class UniTE(TokenMethod):
    """UniTE: only the union of each member's top-k tokens is considered; each member's
    distribution is restricted to that set and renormalised (a candidate a member lacks is
    scored through its first sub-token), averaged, argmax or sampled.

    Args:
        top_k: candidates per member (the paper's k = 10); a positive integer.
        weights: one per member (normalised); default equal.
    """

    def __init__(self, top_k: int = 10, weights: Sequence[float] | None = None):
        super().__init__(weights)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"`top_k` has to be a positive integer, but is {top_k!r}.")
        self.top_k = top_k

    def decide(self, run: _TokenRun, probs: dict[int, torch.Tensor], generator: torch.Generator | None) -> int:
        scored = run.combiner.unite(probs, self.top_k, first_tokens_of(run.sessions))
        return run.combiner.choose(scored, run.settings, generator, run.combiner.preferred(probs))

    def __repr__(self) -> str:
        return f"UniTE(top_k={self.top_k}, weights={self.weights})"


class _TokenRun(MethodRun):
    def __init__(
        self, method: TokenMethod, members: Sequence[Member], combiner: Combiner, settings: GenerationSettings
    ):
        self.method = method
        self.members = members
        self.combiner = combiner
        self.settings = settings
        self.steps = 0
        self.ensembled = 0
        self.shortcut_hits = 0
        self.sessions: dict[int, MemberSession] = {}

    def step(self, state: DecodeState) -> list[Commit]:
        self.sessions = state.sessions
        commits: list[Commit | None] = [None] * state.rows
        to_ensemble = list(range(state.rows))
        gate = self.method.gate()
        if gate is not None:
            to_ensemble = self._gated(state, gate, commits)
        if to_ensemble:
            logits = {m: session.next_logits(to_ensemble) for m, session in state.sessions.items()}
            temperature = 1.0 if self.settings.greedy else self.settings.temperature
            for k, row in enumerate(to_ensemble):
                probs = {
                    m: self.combiner.member_probs(logits[m][k], temperature)
                    for m in in_step_members(state, row, list(logits))
                }
                entry = self.method.decide(self, probs, state.generators[row])
                commits[row] = self._entry_commit(entry, probs)
        self.steps += state.rows
        self.ensembled += len(to_ensemble)
        return [c for c in commits if c is not None]

    def _gated(self, state: DecodeState, gate: tuple[int, float], commits: list[Commit | None]) -> list[int]:
        primary, threshold = gate
        member = self.members[primary]
        logits = state.sessions[primary].next_logits()
        rest = []
        for row in range(state.rows):
            if float(torch.softmax(logits[row].float(), dim=-1).max()) <= threshold:
                rest.append(row)
                continue
            token = choose_token(logits[row], self.settings, state.generators[row])
            commits[row] = token_commit(member, primary, token)
        return rest

    def _entry_commit(self, entry: int, probs: dict[int, torch.Tensor]) -> Commit:
        if entry == EOS_INDEX:
            return Commit(eos=True)
        producers = {}
        for member, member_probs in probs.items():
            token, top = self.combiner.top_entry(member, member_probs)
            if top == entry:
                producers[member] = [token]
        return Commit(text=self.combiner.union.entries[entry], proposals=producers)

    def stats(self) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "union_size": self.combiner.union.size,
            "steps": self.steps,
            "ensembled_steps": self.ensembled,
            "share_ensembled": self.ensembled / self.steps if self.steps else 0.0,
        }
        if self.settings.greedy and isinstance(self.method, GaC):
            figures["shortcut_share"] = self.shortcut_hits / self.ensembled if self.ensembled else 0.0
        return figures
