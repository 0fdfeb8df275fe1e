"""SpecFuse with model exit, and SpecEM's online (Hedge) weights (docs/explanation/methods.md#specfuse)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import MemberVocab, RequestId, ScoreKind
from ensemble_core.methods.base import (
    Binding,
    DecodeState,
    Method,
    MethodRun,
    bind_all,
    check_flag,
    numeric_weights,
    register,
)
from ensemble_core.methods.drafting import DraftSpec, SegmentRun, SpanCandidate

_SCORES = ("logprob", "logit")
_ANY_NUMBER_OF_WORDS = 1 << 30


@register("specfuse")
@dataclass(frozen=True)
class SpecFuse(Method):
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

    constraint_refusal = (
        "its members draft whole segments freely, and trimming candidates to the part a grammar allows is not built yet"
    )

    segment_tokens: int = 10
    score: str = "logprob"
    exit: bool = True
    exit_warmup: int = 2
    exit_tau: float = 0.1
    exit_verify: bool = False
    hedge_eta: float | None = None
    weights: tuple[float, ...] | None = None
    unit: str = "words"

    def __post_init__(self) -> None:
        self.spec  # noqa: B018 - checks segment_tokens and unit, naming them
        if self.score not in _SCORES:
            raise ConfigError(f"`score` has to be one of {list(_SCORES)}, but is {self.score!r}.")
        check_flag(self.exit, "exit")
        check_flag(self.exit_verify, "exit_verify")
        warmup = self.exit_warmup
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ConfigError(f"`exit_warmup` has to be a non-negative integer, but is {warmup!r}.")
        if not _positive(self.exit_tau):
            raise ConfigError(f"`exit_tau` has to be > 0, but is {self.exit_tau!r}.")
        if self.hedge_eta is not None and not _positive(self.hedge_eta):
            raise ConfigError(f"`hedge_eta` has to be > 0 (or None for fixed weights), but is {self.hedge_eta!r}.")
        if self.hedge_eta is not None and self.weights is not None:
            raise ConfigError("`hedge_eta` learns the weights; give either `weights` or `hedge_eta`, not both.")
        learns = " (or learns them online with `hedge_eta`: SpecEM)"
        object.__setattr__(self, "weights", numeric_weights(self.weights, "SpecFuse", learns))
        object.__setattr__(self, "exit_tau", float(self.exit_tau))
        object.__setattr__(self, "hedge_eta", None if self.hedge_eta is None else float(self.hedge_eta))

    @property
    def spec(self) -> DraftSpec:
        """Words: draft up to segment_tokens tokens, then cut back to the last whole word."""
        length = self.segment_tokens if self.unit == "tokens" else _ANY_NUMBER_OF_WORDS
        return DraftSpec(self.unit, length, self.segment_tokens, "segment_tokens", "segment_tokens")

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        return bind_all(self, members, self.weights)

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        return _SpecFuseRun(self, binding, settings)


def _positive(value: object) -> bool:
    try:
        return float(value) > 0.0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def normalise(values: list[float], kind: str) -> list[float]:
    """One verifier's scores over a round's candidates, made to sum to 1 (see SpecFuse)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if kind == "logprob":
        tensor = torch.exp(tensor - tensor.max())  # exp(mean log-prob), rescaled: the ratio is what counts
    elif not bool((tensor > 0).all()):
        tensor = torch.softmax(tensor, dim=0)
    return (tensor / tensor.sum()).tolist()


class _SpecFuseRun(SegmentRun):
    def __init__(self, method: SpecFuse, binding: Binding, settings: GenerationSettings):
        super().__init__(binding, settings, method.spec, ScoreKind(method.score))
        self.method = method
        self._weights: dict[RequestId, list[float]] = {}  # per request: verifier weights (Hedge updates them)
        self._quality: dict[RequestId, dict[int, list[float]]] = {}  # per request: member -> scores it got
        self._exited: dict[RequestId, set[int]] = {}
        self._rounds_seen: dict[RequestId, int] = {}

    def forget(self, request: RequestId) -> None:
        for per_request in (self._weights, self._quality, self._exited, self._rounds_seen):
            per_request.pop(request, None)

    def drafters(self, state: DecodeState, row: RequestId) -> list[int]:
        active = [m for m in super().drafters(state, row) if m not in self._exited.get(row, set())]
        return active or super().drafters(state, row)[:1]

    def scorers(self, state: DecodeState) -> list[int]:
        if not self.method.exit_verify:
            return list(state.sessions)
        exited = [self._exited.get(r, set()) for r in state.requests]
        everywhere = set.intersection(*exited) if exited else set()
        return [m for m in state.sessions if m not in everywhere] or list(state.sessions)

    def select(
        self, state: DecodeState, row: RequestId, candidates: list[SpanCandidate], scores: dict[int, list[float]]
    ) -> int:
        weights = self._weights.setdefault(row, list(self.binding.weights))
        normalised = {j: normalise(values, self.method.score) for j, values in scores.items()}
        total = [sum(weights[j] * normalised[j][c] for j in normalised) for c in range(len(candidates))]
        self._after_round(row, candidates, normalised, total)
        return max(range(len(candidates)), key=lambda c: (total[c], -min(candidates[c].proposers)))

    def _after_round(
        self, row: RequestId, candidates: list[SpanCandidate], normalised: dict[int, list[float]], total: list[float]
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

    def _hedge(self, row: RequestId, owner: dict[int, int], normalised: dict[int, list[float]]) -> None:
        weights = self._weights[row]
        count = len(weights)
        if count < 2 or self.method.hedge_eta is None:
            return
        step = self.method.hedge_eta * math.sqrt(1.0 / count) / self._rounds_seen[row]
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

    def _exit(self, row: RequestId, owner: dict[int, int]) -> None:
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
                name = self.members[member].name
                if name not in self._stats(row).exited:
                    self._stats(row).exited.append(name)

    def record(self, state, row, candidates, winner, drafters, scores) -> None:
        super().record(state, row, candidates, winner, drafters, scores)
        weights = self._weights.get(row, list(self.binding.weights))
        stats = self._stats(row)
        named = {state.members[m].name: round(w, 4) for m, w in enumerate(weights)}
        stats.per_round[-1] = replace(stats.per_round[-1], weights=named)
