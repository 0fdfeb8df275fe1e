"""SpecFuse with model exit, and SpecEM's online (Hedge) weights (ALGORITHMS.md section 5)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.methods.base import DecodeState, EnsembleMethod, MethodRun, register
from ensemble_core.methods.drafting import Candidate, DraftSpec, SegmentRun

_SCORES = ("logprob", "logit")
_ANY_NUMBER_OF_WORDS = 1 << 30


@register("specfuse")
class SpecFuse(EnsembleMethod):
    """Every active member drafts a segment; every member scores all segments in one forward;
    the segment with the best weighted sum of normalised scores wins and is committed.

    Our rules where the papers are silent (documented): a verifier's scores are normalised
    to sum to 1 over the round's candidates: for "logprob" (default), exp(mean log-prob),
    the geometric-mean token probability; for "logit" (the reference's mean raw logit), the
    values themselves when all are positive, else their softmax. Model exit: a member's
    quality Q_i is the mean normalised score its candidates got; after `exit_warmup` rounds a
    member stops drafting when softmax(Q / exit_tau)_i < 0.5 / n (n: members still drafting);
    the best member always drafts; an exited member keeps verifying unless `exit_verify`.
    Hedge (SpecEM, with `hedge_eta`): per round t, wins_i = max(1, #{(j, k): j != i, k != i,
    s_j(c_i) >= s_j(c_k)}), r_i = wins_i / (K - 1)^2, eta_t = eta * sqrt(1 / K) / t,
    w_i *= exp(eta_t * r_i), normalised; weights start equal for every prompt.

    Args:
        segment_tokens: tokens per segment (cut back to the last whole word), at least 1.
        score: "logprob" or "logit".
        exit: turn model exit on.
        exit_warmup: rounds before anyone may exit (>= 0).
        exit_tau: the softmax temperature of the exit rule (> 0).
        exit_verify: exited members also stop verifying.
        hedge_eta: the Hedge learning rate (> 0), or None for fixed weights.
        weights: fixed verifier weights (normalised); default equal.
        unit: "words" (cut back to whole words, default) or "tokens" (exactly segment_tokens).
    """

    def __init__(
        self,
        segment_tokens: int = 10,
        score: str = "logprob",
        exit: bool = True,
        exit_warmup: int = 2,
        exit_tau: float = 0.1,
        exit_verify: bool = False,
        hedge_eta: float | None = None,
        weights: Sequence[float] | None = None,
        unit: str = "words",
    ):
        if score not in _SCORES:
            raise ConfigError(f"`score` has to be one of {list(_SCORES)}, but is {score!r}.")
        if isinstance(exit_warmup, bool) or not isinstance(exit_warmup, int) or exit_warmup < 0:
            raise ConfigError(f"`exit_warmup` has to be a non-negative integer, but is {exit_warmup!r}.")
        if not float(exit_tau) > 0.0:
            raise ConfigError(f"`exit_tau` has to be > 0, but is {exit_tau}.")
        if hedge_eta is not None and not float(hedge_eta) > 0.0:
            raise ConfigError(f"`hedge_eta` has to be > 0 (or None for fixed weights), but is {hedge_eta}.")
        if hedge_eta is not None and weights is not None:
            raise ConfigError("`hedge_eta` learns the weights; give either `weights` or `hedge_eta`, not both.")
        # "words": draft up to segment_tokens tokens, then cut back to the last whole word.
        self.spec = DraftSpec(unit, segment_tokens if unit == "tokens" else _ANY_NUMBER_OF_WORDS, segment_tokens)
        self.score = score
        self.exit = bool(exit)
        self.exit_warmup = exit_warmup
        self.exit_tau = float(exit_tau)
        self.exit_verify = bool(exit_verify)
        self.hedge_eta = None if hedge_eta is None else float(hedge_eta)
        super().__init__(weights)

    def start(self, members: Sequence[Member], settings: GenerationSettings) -> MethodRun:
        return _SpecFuseRun(self, members, settings)

    def __repr__(self) -> str:
        return (
            f"SpecFuse(segment_tokens={self.spec.cap}, score={self.score!r}, exit={self.exit}, "
            f"exit_warmup={self.exit_warmup}, hedge_eta={self.hedge_eta})"
        )


def normalise(values: list[float], kind: str) -> list[float]:
    """One verifier's scores over a round's candidates, made to sum to 1 (see SpecFuse)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if kind == "logprob":
        tensor = torch.exp(tensor - tensor.max())  # exp(mean log-prob), rescaled: the ratio is what counts
    elif not bool((tensor > 0).all()):
        tensor = torch.softmax(tensor, dim=0)
    return (tensor / tensor.sum()).tolist()


class _SpecFuseRun(SegmentRun):
    def __init__(self, method: SpecFuse, members: Sequence[Member], settings: GenerationSettings):
        super().__init__(members, settings, method.spec, kind=method.score)
        self.method = method
        self._weights: dict[int, list[float]] = {}  # per row: verifier weights (Hedge updates them)
        self._quality: dict[int, dict[int, list[float]]] = {}  # per row: member -> scores of its candidates
        self._exited: dict[int, set[int]] = {}
        self._rounds_seen: dict[int, int] = {}

    def drafters(self, state: DecodeState, row: int) -> list[int]:
        active = [m for m in super().drafters(state, row) if m not in self._exited.get(row, set())]
        return active or super().drafters(state, row)[:1]

    def scorers(self, state: DecodeState) -> list[int]:
        if not self.method.exit_verify:
            return list(state.sessions)
        everywhere = set.intersection(*(self._exited.get(r, set()) for r in range(state.rows))) if state.rows else set()
        return [m for m in state.sessions if m not in everywhere] or list(state.sessions)

    def select(self, state: DecodeState, row: int, candidates: list[Candidate], scores: dict[int, list[float]]) -> int:
        weights = self._weights.setdefault(row, list(self.method.member_weights))
        normalised = {j: normalise(values, self.method.score) for j, values in scores.items()}
        total = [sum(weights[j] * normalised[j][c] for j in normalised) for c in range(len(candidates))]
        self._after_round(row, candidates, normalised, total)
        return max(range(len(candidates)), key=lambda c: (total[c], -min(candidates[c].proposers)))

    def _after_round(
        self, row: int, candidates: list[Candidate], normalised: dict[int, list[float]], total: list[float]
    ) -> None:
        self._rounds_seen[row] = self._rounds_seen.get(row, 0) + 1
        quality = self._quality.setdefault(row, {})
        owner = {m: c for c, candidate in enumerate(candidates) for m in candidate.proposers}
        for member, c in owner.items():
            quality.setdefault(member, []).append(total[c])
        if self.method.hedge_eta is not None:
            self._hedge(row, owner, normalised)
        if self.method.exit and self._rounds_seen[row] > self.method.exit_warmup:
            self._exit(row, owner)

    def _hedge(self, row: int, owner: dict[int, int], normalised: dict[int, list[float]]) -> None:
        weights = self._weights[row]
        count = len(weights)
        if count < 2:
            return
        step = self.method.hedge_eta * math.sqrt(1.0 / count) / self._rounds_seen[row]  # type: ignore[operator]
        for i, ci in owner.items():
            wins = sum(
                1
                for j in normalised
                if j != i
                for k, ck in owner.items()
                if k != i and normalised[j][ci] >= normalised[j][ck]
            )
            weights[i] *= math.exp(step * max(1, wins) / (count - 1) ** 2)
        total = sum(weights)
        self._weights[row] = [w / total for w in weights]

    def _exit(self, row: int, owner: dict[int, int]) -> None:
        quality = self._quality[row]
        active = [m for m in owner if m not in self._exited.get(row, set())]
        if len(active) < 2:
            return
        means = torch.tensor([sum(quality[m]) / len(quality[m]) for m in active], dtype=torch.float64)
        shares = torch.softmax(means / self.method.exit_tau, dim=0)
        best = active[int(torch.argmax(means))]
        for member, share in zip(active, shares.tolist(), strict=True):
            if member != best and share < 0.5 / len(active):
                self._exited.setdefault(row, set()).add(member)

    def record(self, state, row, candidates, winner, drafters, scores) -> None:
        super().record(state, row, candidates, winner, drafters, scores)
        weights = self._weights.get(row, self.method.member_weights)
        self.rounds[-1]["weights"] = {state.members[m].name: round(w, 4) for m, w in enumerate(weights)}

    def stats(self) -> dict[str, Any]:
        figures = super().stats()
        figures["exited"] = {row: sorted(self.members[m].name for m in found) for row, found in self._exited.items()}
        return figures
