"""SweetSpan: span-level ensembling with filtered perplexity scores (ALGORITHMS.md section 4)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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
    numeric_weights,
    register,
)
from ensemble_core.methods.drafting import DraftSpec, SegmentRun, SpanCandidate


@register("sweetspan")
@dataclass(frozen=True)
class SweetSpan(Method):
    """Each member drafts a span of whole words; every member scores every span by its mean
    token log-probability (perplexity) in its own tokens; unfaithful scores are dropped and
    the rest combined by mean normalised rank.

    The paper's exact filter is not public; ours, documented and configurable:
    (a) a member's score of its own span is dropped (self-preference) unless `self_score`, but
        only when every scorer still ranks at least two spans without it: with two members each
        scorer would see one span, and a rank of one span says nothing;
    (b) per span, a score further than `outlier_mad` median absolute deviations from the
        median of the other kept scores is dropped (with three or more scores);
    (c) each scorer ranks the spans it kept (best 1, worst 0); a span's score is the mean of
        its normalised ranks, weighted by the scorers' `weights` (equal by default); ties go to
        the better weighted mean CENTRED score (each scorer's score minus its mean over the
        spans it kept: differences within one model compare, raw log-probabilities of two
        models do not), then member order.

    With a strong member among weak ones, (a) hands the strong member's own span to the weak
    members' judgement alone, whatever the weights; `self_score=True` with the strong member
    weighted up lets its judgement count everywhere (`ensemble-llm calibrate` picks both on a
    held-out slice).

    Args:
        span_words: words per span (a word = a whitespace-led run), at least 1.
        max_span_tokens: token cap per span (the span is cut back to its last whole word).
        self_score: keep members' scores of their own spans.
        outlier_mad: the outlier cut-off in median absolute deviations (> 0).
        unit: "words" (default) or "tokens" (then `span_words` counts tokens).
        weights: the scorers' weights (numbers, one per member, normalised); default equal.
    """

    span_words: int = 4
    max_span_tokens: int = 16
    self_score: bool = False
    outlier_mad: float = 2.0
    unit: str = "words"
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        DraftSpec(self.unit, self.span_words, self.max_span_tokens, "span_words", "max_span_tokens")
        try:
            mad = float(self.outlier_mad)
        except (TypeError, ValueError):
            mad = float("nan")
        if not mad > 0.0:
            raise ConfigError(f"`outlier_mad` has to be > 0, but is {self.outlier_mad!r}.")
        object.__setattr__(self, "outlier_mad", mad)
        object.__setattr__(self, "self_score", bool(self.self_score))
        object.__setattr__(self, "weights", numeric_weights(self.weights, "SweetSpan"))

    @property
    def spec(self) -> DraftSpec:
        return DraftSpec(self.unit, self.span_words, self.max_span_tokens, "span_words", "max_span_tokens")

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        return bind_all(self, members, self.weights)

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        return _SweetSpanRun(self, binding, settings)


def filtered_scores(
    candidates: list[SpanCandidate], scores: dict[int, list[float]], self_score: bool, outlier_mad: float
) -> dict[int, dict[int, float]]:
    """scorer -> candidate index -> kept score, after the self-preference and outlier filters."""
    everything = {scorer: dict(enumerate(values)) for scorer, values in scores.items()}
    without_self = {
        scorer: {c: s for c, s in values.items() if scorer not in candidates[c].proposers}
        for scorer, values in everything.items()
    }
    keep_self = self_score or any(len(values) < 2 for values in without_self.values())
    kept = everything if keep_self else without_self
    kept = {scorer: dict(values) for scorer, values in kept.items()}
    for c in range(len(candidates)):
        values = [kept[j][c] for j in kept if c in kept[j]]
        if len(values) < 3:
            continue
        median = statistics.median(values)
        spread = statistics.median(abs(v - median) for v in values)
        for scorer in kept:
            if c in kept[scorer] and spread > 0 and abs(kept[scorer][c] - median) > outlier_mad * spread:
                del kept[scorer][c]
    return kept


def rank_combined(kept: dict[int, dict[int, float]], count: int, weights: Sequence[float] | None = None) -> list[float]:
    """Weighted (default: plain) mean normalised rank per candidate (1 best, 0 worst per scorer);
    -1 where nobody scored."""
    ranks: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    for scorer, values in kept.items():
        ordered = sorted(values, key=lambda c: -values[c])
        for position, c in enumerate(ordered):
            rank = 1.0 if len(ordered) == 1 else 1.0 - position / (len(ordered) - 1)
            ranks[c].append((1.0 if weights is None else weights[scorer], rank))
    return [_weighted_mean(r) if r else -1.0 for r in ranks]


def centred_means(kept: dict[int, dict[int, float]], count: int, weights: Sequence[float] | None = None) -> list[float]:
    """Per candidate, the weighted (default: plain) mean over scorers of (its score minus that
    scorer's mean score)."""
    centred: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    for scorer, values in kept.items():
        if not values:
            continue
        mean = statistics.fmean(values.values())
        for c, value in values.items():
            centred[c].append((1.0 if weights is None else weights[scorer], value - mean))
    return [_weighted_mean(v) if v else float("-inf") for v in centred]


def _weighted_mean(pairs: list[tuple[float, float]]) -> float:
    """sum w*x / sum w, added exactly, so the same pairs in any order give the same mean (ties
    between spans stay ties); the plain mean where every weight is zero."""
    total = math.fsum(w for w, _ in pairs)
    if total <= 0.0:
        return math.fsum(x for _, x in pairs) / len(pairs)
    return math.fsum(w * x for w, x in pairs) / total


def select_span(
    candidates: list[SpanCandidate],
    scores: dict[int, list[float]],
    self_score: bool,
    outlier_mad: float,
    weights: Sequence[float] | None = None,
) -> int:
    """SweetSpan's winner (see the class docstring)."""
    kept = filtered_scores(candidates, scores, self_score, outlier_mad)
    combined = rank_combined(kept, len(candidates), weights)
    centred = centred_means(kept, len(candidates), weights)
    return max(range(len(candidates)), key=lambda c: (combined[c], centred[c], -min(candidates[c].proposers)))


class _SweetSpanRun(SegmentRun):
    def __init__(self, method: SweetSpan, binding: Binding, settings: GenerationSettings):
        super().__init__(binding, settings, method.spec, ScoreKind.LOGPROB)
        self.method = method

    def select(
        self, state: DecodeState, row: RequestId, candidates: list[SpanCandidate], scores: dict[int, list[float]]
    ) -> int:
        method = self.method
        return select_span(candidates, scores, method.self_score, method.outlier_mad, self.binding.weights)
