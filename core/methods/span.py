"""SweetSpan: span-level ensembling with filtered perplexity scores (ALGORITHMS.md section 4)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.methods.base import DecodeState, EnsembleMethod, MethodRun, register
from ensemble_core.methods.drafting import Candidate, DraftSpec, SegmentRun


@register("sweetspan")
class SweetSpan(EnsembleMethod):
    """Each member drafts a span of whole words; every member scores every span by its mean
    token log-probability (perplexity) in its own tokens; unfaithful scores are dropped and
    the rest combined by mean normalised rank.

    The paper's exact filter is not public; ours, documented and configurable:
    (a) a member's score of its own span is dropped (self-preference) unless `self_score`;
    (b) per span, a score further than `outlier_mad` median absolute deviations from the
        median of the other kept scores is dropped;
    (c) each scorer ranks the spans it kept (best 1, worst 0); a span's score is the mean of
        its normalised ranks; ties go to the better mean log-probability, then member order.

    Args:
        span_words: words per span (a word = a whitespace-led run), at least 1.
        max_span_tokens: token cap per span (the span is cut back to its last whole word).
        self_score: keep members' scores of their own spans.
        outlier_mad: the outlier cut-off in median absolute deviations (> 0).
        unit: "words" (default) or "tokens" (then `span_words` counts tokens).
    """

    def __init__(
        self,
        span_words: int = 4,
        max_span_tokens: int = 16,
        self_score: bool = False,
        outlier_mad: float = 2.0,
        unit: str = "words",
    ):
        self.spec = DraftSpec(unit, span_words, max_span_tokens)
        if not float(outlier_mad) > 0.0:
            raise ConfigError(f"`outlier_mad` has to be > 0, but is {outlier_mad}.")
        super().__init__()
        self.self_score = bool(self_score)
        self.outlier_mad = float(outlier_mad)

    def start(self, members: Sequence[Member], settings: GenerationSettings) -> MethodRun:
        return _SweetSpanRun(self, members, settings)

    def __repr__(self) -> str:
        return (
            f"SweetSpan(span_words={self.spec.length}, max_span_tokens={self.spec.cap}, "
            f"self_score={self.self_score}, outlier_mad={self.outlier_mad}, unit={self.spec.unit!r})"
        )


def filtered_scores(
    candidates: list[Candidate], scores: dict[int, list[float]], self_score: bool, outlier_mad: float
) -> dict[int, dict[int, float]]:
    """scorer -> candidate index -> kept score, after the self-preference and outlier filters."""
    kept: dict[int, dict[int, float]] = {
        scorer: {c: s for c, s in enumerate(values) if self_score or scorer not in candidates[c].proposers}
        for scorer, values in scores.items()
    }
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


def rank_combined(kept: dict[int, dict[int, float]], count: int) -> list[float]:
    """Mean normalised rank per candidate (1 best, 0 worst per scorer); -1 where nobody scored."""
    ranks: list[list[float]] = [[] for _ in range(count)]
    for values in kept.values():
        ordered = sorted(values, key=lambda c: -values[c])
        for position, c in enumerate(ordered):
            ranks[c].append(1.0 if len(ordered) == 1 else 1.0 - position / (len(ordered) - 1))
    return [sum(r) / len(r) if r else -1.0 for r in ranks]


class _SweetSpanRun(SegmentRun):
    def __init__(self, method: SweetSpan, members: Sequence[Member], settings: GenerationSettings):
        super().__init__(members, settings, method.spec)
        self.method = method

    def select(self, state: DecodeState, row: int, candidates: list[Candidate], scores: dict[int, list[float]]) -> int:
        kept = filtered_scores(candidates, scores, self.method.self_score, self.method.outlier_mad)
        combined = rank_combined(kept, len(candidates))
        mean_kept = [
            statistics.fmean([kept[j][c] for j in kept if c in kept[j]] or [float("-inf")])
            for c in range(len(candidates))
        ]
        return max(range(len(candidates)), key=lambda c: (combined[c], mean_kept[c], -min(candidates[c].proposers)))
