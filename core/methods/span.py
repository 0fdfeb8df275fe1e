"""SweetSpan: span-level ensembling with filtered perplexity scores (docs/explanation/methods.md#sweetspan)."""

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
    check_flag,
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
        scorers' median is dropped (with three or more scores). Each scorer's scores are first
        standardised over the spans it kept (its own scale: a confident model is not an
        outlier for being confident), and the median and deviations are weighted by `weights`
        (a scorer weighted past one half defines the consensus and is never voted out);
    (c) each scorer ranks the spans it kept (best 1, worst 0); a span's score is the mean of
        its normalised ranks, weighted by the scorers' `weights` (equal by default); ties go to
        the better weighted mean CENTRED score (each scorer's score minus its mean over the
        spans it kept: differences within one model compare, raw log-probabilities of two
        models do not), then member order.

    With a strong member among weak ones at equal weights the weak members outvote it, and (a)
    hands its own span to them alone whatever the weights; `self_score=True` with the strong
    member weighted up lets its judgement count everywhere (`ensemble-llm calibrate` picks both
    on a held-out slice).

    Args:
        span_words: words per span (a word = a whitespace-led run), at least 1.
        max_span_tokens: token cap per span (the span is cut back to its last whole word).
        self_score: keep members' scores of their own spans.
        outlier_mad: the outlier cut-off in median absolute deviations (> 0).
        unit: "words" (default) or "tokens" (then `span_words` counts tokens).
        weights: the scorers' weights (numbers, one per member, normalised); default equal.
    """

    constraint_refusal = (
        "its members draft whole spans freely, and trimming candidates to the part a grammar allows is not built yet"
    )

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
        check_flag(self.self_score, "self_score")
        object.__setattr__(self, "weights", numeric_weights(self.weights, "SweetSpan"))

    @property
    def spec(self) -> DraftSpec:
        return DraftSpec(self.unit, self.span_words, self.max_span_tokens, "span_words", "max_span_tokens")

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        return bind_all(self, members, self.weights)

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        return _SweetSpanRun(self, binding, settings)


def filtered_scores(
    candidates: list[SpanCandidate],
    scores: dict[int, list[float]],
    self_score: bool,
    outlier_mad: float,
    weights: Sequence[float] | None = None,
) -> dict[int, dict[int, float]]:
    """scorer -> candidate index -> kept score, after the self-preference and outlier filters.

    The outlier test reads each scorer's scores on its own scale (standardised over the spans it
    kept): raw log-probabilities of two models do not compare, and on the raw scale a confident
    strong model sits far from weak models' median and lost every score it gave. The consensus
    is the weighted median, so a scorer that carries most of the weight defines it instead of
    being voted out by the rest."""
    everything = {scorer: dict(enumerate(values)) for scorer, values in scores.items()}
    without_self = {
        scorer: {c: s for c, s in values.items() if scorer not in candidates[c].proposers}
        for scorer, values in everything.items()
    }
    keep_self = self_score or any(len(values) < 2 for values in without_self.values())
    kept = everything if keep_self else without_self
    kept = {scorer: dict(values) for scorer, values in kept.items()}
    standard = {scorer: _standardised(values) for scorer, values in kept.items()}
    for c in range(len(candidates)):
        judged = [(scorer, values[c]) for scorer, values in standard.items() if c in values]
        if len(judged) < 3:
            continue
        pairs = [(_weight(weights, scorer), z) for scorer, z in judged]
        centre = weighted_median(pairs)
        spread = weighted_median([(w, abs(z - centre)) for w, z in pairs])
        for scorer, z in judged:
            if spread > 0 and abs(z - centre) > outlier_mad * spread:
                del kept[scorer][c]
    return kept


def _standardised(values: dict[int, float]) -> dict[int, float]:
    """A scorer's finite scores in standard deviations from their mean (all 0 when it scored
    every span alike: no opinion). An impossible span (-inf) has no place on that scale; it
    stays out of the outlier test, and the ranks still put it last."""
    finite = {c: v for c, v in values.items() if math.isfinite(v)}
    if len(finite) < 2:
        return {}
    mean = statistics.fmean(finite.values())
    deviation = statistics.pstdev(finite.values())
    return {c: 0.0 if deviation == 0 else (v - mean) / deviation for c, v in finite.items()}


def _weight(weights: Sequence[float] | None, scorer: int) -> float:
    return 1.0 if weights is None else weights[scorer]


def weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The value where half the weight lies on either side; between two values when the half
    falls exactly on a boundary, so equal weights give `statistics.median`. Weights that are all
    zero count as equal."""
    if math.fsum(w for w, _ in pairs) <= 0.0:
        pairs = [(1.0, x) for _, x in pairs]
    ordered = sorted(pairs, key=lambda pair: pair[1])
    half = math.fsum(w for w, _ in ordered) / 2
    below = 0.0
    for index, (w, x) in enumerate(ordered):
        below += w
        if math.isclose(below, half, rel_tol=1e-12, abs_tol=0.0) and index + 1 < len(ordered):
            return (x + ordered[index + 1][1]) / 2
        if below > half:
            return x
    return ordered[-1][1]


def rank_combined(kept: dict[int, dict[int, float]], count: int, weights: Sequence[float] | None = None) -> list[float]:
    """Weighted (default: plain) mean normalised rank per candidate (1 best, 0 worst per scorer);
    -1 where nobody scored."""
    ranks: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    for scorer, values in kept.items():
        ordered = sorted(values, key=lambda c: -values[c])
        for position, c in enumerate(ordered):
            rank = 1.0 if len(ordered) == 1 else 1.0 - position / (len(ordered) - 1)
            ranks[c].append((_weight(weights, scorer), rank))
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
            centred[c].append((_weight(weights, scorer), value - mean))
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
    kept = filtered_scores(candidates, scores, self_score, outlier_mad, weights)
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
