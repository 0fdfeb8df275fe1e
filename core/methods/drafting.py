"""Shared machinery of the span- and segment-level methods (SweetSpan, SpecFuse/SpecEM).

A round: every drafting member writes a candidate continuation from the shared prefix with its
own cache (greedy or seeded sampling), ended at a whole-word boundary that is also one of its
own token boundaries, or at a token cap, an end-of-sequence token or a stop string; then every
member scores ALL candidates of all requests in ONE forward (`MemberSession.score`); the method
picks a winner; the winner's text is committed. Each member keeps what it wrote as far as the
committed text confirms it (the winner's proposer keeps all its tokens); the others come in
step with the text.

Cutting spans at the drafter's own token boundaries (not inside a token like ".\\n") keeps a
member that always wins exactly on its own greedy path.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import Candidate, MemberVocab, RequestId, ScoreKind, candidate_means
from ensemble_core.members.own_choice import Choice, own_choice
from ensemble_core.methods.base import Binding, Commit, DecodeState, MethodRun, check_positive_int
from ensemble_core.results import MethodStats

_SPACE = frozenset(b" \t\n\r")
UNITS = ("words", "tokens")


@dataclass(frozen=True)
class DraftSpec:
    """How long a candidate is: `length` words (or tokens), and never more than `cap` tokens.

    `length_name` and `cap_name` are the user-facing parameter names errors refer to.
    """

    unit: str
    length: int
    cap: int
    length_name: str = "length"
    cap_name: str = "cap"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ConfigError(f"`unit` has to be one of {list(UNITS)}, but is {self.unit!r}.")
        check_positive_int(self.length, self.length_name)
        check_positive_int(self.cap, self.cap_name)


@dataclass
class SpanCandidate:
    """One distinct candidate text of a request.

    Attributes:
        data: the bytes it appends.
        eos: it ends the sequence after `data`.
        proposers: members that drafted exactly it (several may), and how many tokens each used.
    """

    data: bytes
    eos: bool
    proposers: dict[int, int] = field(default_factory=dict)

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.data, self.eos)


@dataclass
class _Drafting:
    pieces: list[bytes] = field(default_factory=list)
    word_ends: list[int] = field(default_factory=list)  # piece counts after which a word ended
    eos: bool = False
    done: bool = False

    @property
    def text(self) -> bytes:
        return b"".join(self.pieces)


def _starts_word(piece: bytes, text_so_far: bytes) -> bool:
    """A piece that begins with whitespace after some non-space text starts a new word."""
    return bool(piece) and piece[0] in _SPACE and any(b not in _SPACE for b in text_so_far)


def draft_round(
    state: DecodeState, rows_by_drafter: dict[int, list[RequestId]], spec: DraftSpec
) -> dict[int, dict[RequestId, _Drafting]]:
    """Every drafter writes one candidate for each of its requests, its requests in lockstep.

    Returns: drafter -> request -> its draft.
    """
    stops = [s.encode() for s in state.settings.stop]
    longest = max((len(s) for s in stops), default=0)
    tails = {row: state.tail(row, longest) for rows in rows_by_drafter.values() for row in rows}

    def draft(member_index: int) -> dict[RequestId, _Drafting]:
        rows = rows_by_drafter[member_index]
        vocab = state.members[member_index]
        session = state.sessions[member_index]
        drafts = {row: _Drafting() for row in rows}
        budget = {row: min(spec.cap, state.remaining[row]) for row in rows}
        while live := [r for r in rows if not drafts[r].done]:
            found = state.next_of(member_index, live)
            for row in live:
                distribution = found[row]
                if distribution is None:
                    drafts[row].done = True
                    continue
                choice = own_choice(vocab, distribution, state.settings, generators[member_index][row])
                if _extend(drafts[row], choice, spec, budget[row], stops, tails[row]):
                    session.write(row, distribution, choice.pick)
        for one in drafts.values():
            _trim_to_word(one, spec)
        return drafts

    # Drafters draft concurrently (see `members.lanes`), so each samples from a stream of its own.
    generators = {m: {row: state.member_generator(row, m) for row in rows} for m, rows in rows_by_drafter.items()}
    return state.each(rows_by_drafter, draft)


def _extend(draft: _Drafting, choice: Choice, spec: DraftSpec, budget: int, stops: list[bytes], tail: bytes) -> bool:
    """Add a drafted piece; False when it ends the draft without being part of it."""
    if choice.eos or choice.control:  # the end, or a control token (no text): the draft ends here
        draft.eos = choice.eos
        draft.done = True
        return False
    piece = choice.text
    if spec.unit == "words" and _starts_word(piece, draft.text):
        draft.word_ends.append(len(draft.pieces))
        if len(draft.word_ends) >= spec.length:
            draft.done = True  # the piece that starts the next word is not part of this span
            return False
    draft.pieces.append(piece)
    if spec.unit == "tokens" and len(draft.pieces) >= spec.length:
        draft.done = True
    if len(draft.pieces) >= budget or any(stop in tail + draft.text for stop in stops):
        draft.done = True
    return True


def _trim_to_word(draft: _Drafting, spec: DraftSpec) -> None:
    """A words-unit draft cut by the token cap ends at its last whole word (if it has one)."""
    if spec.unit != "words" or draft.eos or len(draft.word_ends) >= spec.length or not draft.word_ends:
        return
    if len(draft.pieces) >= spec.cap:
        draft.pieces = draft.pieces[: draft.word_ends[-1]]


def collect_candidates(
    drafts: dict[int, dict[RequestId, _Drafting]], rows: Sequence[RequestId]
) -> dict[RequestId, list[SpanCandidate]]:
    """Per request, the distinct candidates (identical texts from several members merged)."""
    per_row: dict[RequestId, list[SpanCandidate]] = {}
    for row in rows:
        found: dict[tuple[bytes, bool], SpanCandidate] = {}
        for member_index, member_drafts in drafts.items():
            draft = member_drafts.get(row)
            if draft is None or (not draft.pieces and not draft.eos):
                continue
            key = (draft.text, draft.eos)
            candidate = found.setdefault(key, SpanCandidate(draft.text, draft.eos))
            candidate.proposers[member_index] = len(draft.pieces)
        per_row[row] = list(found.values())
    return per_row


def score_candidates(
    state: DecodeState,
    scorers: Sequence[int],
    candidates: dict[RequestId, list[SpanCandidate]],
    kind: ScoreKind = ScoreKind.LOGPROB,
) -> dict[int, dict[RequestId, list[float]]]:
    """Mean per-token score of every candidate under every scorer, ONE forward per scorer.

    Returns: scorer -> request -> one score per candidate (in candidate order).
    """
    rows = [row for row, found in candidates.items() if found]
    offered = [[c.candidate for c in candidates[r]] for r in rows]

    def scores(scorer: int) -> dict[RequestId, list[float]]:
        found = state.sessions[scorer].score(rows, offered, kind)
        means = iter(candidate_means([s for per_row in found for s in per_row]))
        return {row: [next(means) for _ in per_row] for row, per_row in zip(rows, found, strict=True)}

    return state.each(scorers, scores)


@dataclass(frozen=True)
class RoundRecord:
    """One round of one request: who won, who drafted, how many distinct candidates."""

    winner: tuple[str, ...]
    drafters: tuple[str, ...]
    candidates: int
    weights: dict[str, float] | None = None


@dataclass
class SegmentStats(MethodStats):
    """SweetSpan's and SpecFuse's figures for one prompt.

    Attributes:
        rounds: draft-score-select rounds.
        per_round: per round, a `RoundRecord` (winner(s), drafters, distinct candidates, and
            SpecFuse's weights).
        exited: members that stopped drafting (SpecFuse's model exit).
    """

    rounds: int = 0
    per_round: list[RoundRecord] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)

    @property
    def share_ensembled(self) -> float | None:
        return 1.0 if self.rounds else 0.0

    def winners(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self.per_round:
            for name in record.winner:
                counts[name] = counts.get(name, 0) + 1
        return counts


class SegmentRun(MethodRun):
    """A draft -> score -> select -> commit round; subclasses choose drafters and the winner."""

    def __init__(self, binding: Binding, settings: GenerationSettings, spec: DraftSpec, kind: ScoreKind):
        self.binding = binding
        self.members: Sequence[MemberVocab] = binding.members
        self.settings = settings
        self.spec = spec
        self.kind = kind
        self.counts: dict[RequestId, SegmentStats] = {}

    def _stats(self, request: RequestId) -> SegmentStats:
        return self.counts.setdefault(request, SegmentStats())

    def stats(self, request: RequestId) -> MethodStats:
        return self._stats(request)

    def drop(self, requests: Sequence[RequestId]) -> None:
        for request in requests:
            self.counts.pop(request, None)
            self.forget(request)

    def forget(self, request: RequestId) -> None:
        """Drop a subclass's per-request state."""

    def step(self, state: DecodeState) -> dict[RequestId, Commit]:
        rows = list(state.requests)
        drafters_by_row = {row: self.drafters(state, row) for row in rows}
        rows_by_drafter: dict[int, list[RequestId]] = {}
        for row in rows:
            for member_index in drafters_by_row[row]:
                rows_by_drafter.setdefault(member_index, []).append(row)
        drafts = draft_round(state, dict(sorted(rows_by_drafter.items())), self.spec)
        candidates = collect_candidates(drafts, rows)
        scores = score_candidates(state, self.scorers(state), candidates, self.kind)
        commits = {}
        for row in rows:
            found = candidates[row]
            if not found:  # no drafter could continue: the request ends here
                commits[row] = Commit(eos=True)
                continue
            row_scores = {scorer: scores[scorer][row] for scorer in scores}
            winner = self.select(state, row, found, row_scores) if len(found) > 1 else 0
            self.record(state, row, found, winner, drafters_by_row[row], row_scores)
            chosen = found[winner]
            tokens = max(chosen.proposers.values()) + chosen.eos
            commits[row] = Commit(text=chosen.data, eos=chosen.eos, tokens=max(tokens, 1))
        return commits

    def drafters(self, state: DecodeState, row: RequestId) -> list[int]:
        """Members that draft for this request this round (default: all that can)."""
        ready = [m for m in state.sessions if not state.sessions[m].lagging(row)]
        return ready or list(state.sessions)[:1]

    def scorers(self, state: DecodeState) -> list[int]:
        return list(state.sessions)

    @abstractmethod
    def select(
        self, state: DecodeState, row: RequestId, candidates: list[SpanCandidate], scores: dict[int, list[float]]
    ) -> int:
        """Index of the winning candidate (only called with two or more)."""

    def record(
        self,
        state: DecodeState,
        row: RequestId,
        candidates: list[SpanCandidate],
        winner: int,
        drafters: list[int],
        scores: dict[int, list[float]],
    ) -> None:
        stats = self._stats(row)
        stats.rounds += 1
        stats.per_round.append(
            RoundRecord(
                winner=tuple(self.members[m].name for m in candidates[winner].proposers),
                drafters=tuple(self.members[m].name for m in drafters),
                candidates=len(candidates),
            )
        )


def normalise_scores(values: list[float]) -> torch.Tensor:
    """A float64 tensor of scores (helper for the selection rules)."""
    return torch.tensor(values, dtype=torch.float64)
