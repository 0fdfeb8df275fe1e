"""Shared machinery of the span- and segment-level methods (SweetSpan, SpecFuse/SpecEM).

A round: every drafting member writes a candidate continuation from the shared prefix with
its own KV cache (greedy or seeded sampling), ended at a whole-word boundary that is also
one of its own token boundaries, or at a token cap, an end-of-sequence token or a stop
string; then every member scores ALL candidates of all rows in ONE forward over its cached
prefix (`KVBatch.score_many`, drafts masked out); the method picks a winner; the winner's
text is committed. Its proposer keeps its own ids and their cache; everyone else re-encodes.

Cutting spans at the drafter's own token boundaries (not inside a token like ".\\n") keeps
a member that always wins exactly on its own greedy path.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.members.kv_batch import ScoreRequest
from ensemble_core.members.text_sync import MemberSession
from ensemble_core.methods.base import Commit, DecodeState, MethodRun, in_step_members
from ensemble_core.sampling import choose_token

_SPACE = frozenset(b" \t\n\r")
UNITS = ("words", "tokens")


@dataclass(frozen=True)
class DraftSpec:
    """How long a candidate is: `length` words (or tokens), and never more than `cap` tokens."""

    unit: str
    length: int
    cap: int

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ConfigError(f"`unit` has to be one of {list(UNITS)}, but is {self.unit!r}.")
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ConfigError(f"The span/segment length has to be a positive integer, but is {self.length!r}.")
        if isinstance(self.cap, bool) or not isinstance(self.cap, int) or self.cap < 1:
            raise ConfigError(f"The token cap has to be a positive integer, but is {self.cap!r}.")


@dataclass
class Candidate:
    """One distinct candidate text of a row.

    Attributes:
        data: the bytes it appends.
        eos: it ends the sequence after `data`.
        proposers: member index -> its own ids spelling `data` (several members may draft
            the same text; each keeps its ids if it wins).
    """

    data: bytes
    eos: bool
    proposers: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class _Drafting:
    ids: list[int] = field(default_factory=list)
    text: bytes = b""
    word_ends: list[int] = field(default_factory=list)  # token counts after which a word ended
    eos: bool = False
    done: bool = False


def _starts_word(token_bytes: bytes, text_so_far: bytes) -> bool:
    """A token that begins with whitespace after some non-space text starts a new word."""
    return bool(token_bytes) and token_bytes[0] in _SPACE and any(b not in _SPACE for b in text_so_far)


def draft_round(
    state: DecodeState, rows_by_drafter: dict[int, list[int]], spec: DraftSpec, committed_tails: list[bytes]
) -> dict[int, dict[int, _Drafting]]:
    """Every drafter writes one candidate for each of its rows, its rows in lockstep.

    Returns: drafter -> row -> its draft (ids, text, whether it ended with EOS).
    """
    out: dict[int, dict[int, _Drafting]] = {}
    stops = [s.encode() for s in state.settings.stop]
    for member_index, rows in rows_by_drafter.items():
        member = state.members[member_index]
        session = state.sessions[member_index]
        drafts = {row: _Drafting() for row in rows}
        budget = {row: min(spec.cap, state.remaining[row]) for row in rows}
        while live := [r for r in rows if not drafts[r].done]:
            logits = session.next_logits(live)
            for k, row in enumerate(live):
                token = choose_token(logits[k], state.settings, state.generators[row])
                if _extend(drafts[row], token, member, spec, budget[row], stops, committed_tails[row]):
                    session.speculate(row, [token])
        for draft in drafts.values():
            _trim_to_word(draft, spec, member)
        out[member_index] = drafts
    return out


def _extend(draft: _Drafting, token: int, member: Member, spec: DraftSpec, budget: int, stops, tail: bytes) -> bool:
    """Add a drafted token; False when it ends the draft without being part of it."""
    if token in member.eos_token_ids:
        draft.eos = draft.done = True
        return False
    spelled = member.table.spell([token])
    if spec.unit == "words" and _starts_word(spelled, draft.text):
        draft.word_ends.append(len(draft.ids))
        if len(draft.word_ends) >= spec.length:
            draft.done = True  # the token that starts the next word is not part of this span
            return False
    draft.ids.append(token)
    draft.text += spelled
    if spec.unit == "tokens" and len(draft.ids) >= spec.length:
        draft.done = True
    if len(draft.ids) >= budget or any(stop in tail + draft.text for stop in stops):
        draft.done = True
    return True


def _trim_to_word(draft: _Drafting, spec: DraftSpec, member: Member) -> None:
    """A words-unit draft cut by the token cap ends at its last whole word (if it has one)."""
    if spec.unit != "words" or draft.eos or len(draft.word_ends) >= spec.length or not draft.word_ends:
        return
    if len(draft.ids) >= spec.cap:
        keep = draft.word_ends[-1]
        draft.ids = draft.ids[:keep]
        draft.text = member.table.spell(draft.ids)


def collect_candidates(drafts: dict[int, dict[int, _Drafting]], rows: Sequence[int]) -> dict[int, list[Candidate]]:
    """Per row, the distinct candidates (identical texts from several members merged)."""
    per_row: dict[int, list[Candidate]] = {}
    for row in rows:
        found: dict[tuple[bytes, bool], Candidate] = {}
        for member_index, member_drafts in drafts.items():
            draft = member_drafts.get(row)
            if draft is None or (not draft.ids and not draft.eos):
                continue
            key = (draft.text, draft.eos)
            candidate = found.setdefault(key, Candidate(draft.text, draft.eos))
            candidate.proposers[member_index] = list(draft.ids)
        per_row[row] = list(found.values())
    return per_row


def score_candidates(
    state: DecodeState, scorers: Sequence[int], candidates: dict[int, list[Candidate]], kind: str = "logprob"
) -> dict[int, dict[int, list[float]]]:
    """Mean per-token score of every candidate under every scorer, ONE forward per scorer.

    Each scorer reads a candidate in its own tokens (its own ids where it proposed it), an
    end-of-sequence candidate ending with its own end id. `kind` "logprob": mean log-prob;
    "logit": mean raw logit of the candidate's tokens.

    Returns: scorer -> row -> one score per candidate (in candidate order).
    """
    scores: dict[int, dict[int, list[float]]] = {}
    rows = [row for row, found in candidates.items() if found]
    for scorer in scorers:
        session = state.sessions[scorer]
        member = state.members[scorer]
        if any(session.batch.cached_length(r) < session.synced_length(r) - 1 for r in rows):
            session.batch.forward_pending()  # a member that did not draft catches up first
        requests = [
            ScoreRequest(row, session.synced_length(row), [_ids_for(c, scorer, member, session, row) for c in found])
            for row, found in candidates.items()
            if found
        ]
        results = session.batch.score_many(requests, kind=kind)
        scores[scorer] = {
            request.row: [float(values.mean()) for values in result]
            for request, result in zip(requests, results, strict=True)
        }
    return scores


def _ids_for(candidate: Candidate, scorer: int, member: Member, session: MemberSession, row: int) -> list[int]:
    if scorer in candidate.proposers:
        ids = list(candidate.proposers[scorer])
    else:
        ids = session.encoder.encode(session.held(row) + candidate.data) if candidate.data else []
    if candidate.eos:
        ids.append(_end_id(member))
    return ids


def _end_id(member: Member) -> int:
    preferred = getattr(member.tokenizer, "eos_token_id", None)
    return preferred if preferred in member.eos_token_ids else min(member.eos_token_ids)


class SegmentRun(MethodRun):
    """A draft -> score -> select -> commit round; subclasses choose drafters and the winner."""

    def __init__(self, members: Sequence[Member], settings: GenerationSettings, spec: DraftSpec, kind: str = "logprob"):
        self.members = members
        self.settings = settings
        self.spec = spec
        self.kind = kind
        self.rounds: list[dict[str, Any]] = []
        self.round_count = 0

    def step(self, state: DecodeState) -> list[Commit]:
        self.round_count += 1
        rows = list(range(state.rows))
        drafters_by_row = {row: self.drafters(state, row) for row in rows}
        rows_by_drafter: dict[int, list[int]] = {}
        for row in rows:
            for member_index in drafters_by_row[row]:
                rows_by_drafter.setdefault(member_index, []).append(row)
        tails = [self._committed_tail(state, row) for row in rows]
        drafts = draft_round(state, dict(sorted(rows_by_drafter.items())), self.spec, tails)
        candidates = collect_candidates(drafts, rows)
        scores = score_candidates(state, self.scorers(state), candidates, self.kind)
        commits = []
        for row in rows:
            found = candidates[row]
            row_scores = {scorer: scores[scorer][row] for scorer in scores}
            winner = self.select(state, row, found, row_scores) if len(found) > 1 else 0
            self.record(state, row, found, winner, drafters_by_row[row], row_scores)
            chosen = found[winner]
            tokens = max(len(ids) for ids in chosen.proposers.values()) + chosen.eos
            commits.append(Commit(text=chosen.data, eos=chosen.eos, tokens=max(tokens, 1), proposals=chosen.proposers))
        return commits

    def _committed_tail(self, state: DecodeState, row: int) -> bytes:
        """Enough committed text for a stop string to begin in it and end in a draft."""
        longest = max((len(stop.encode()) for stop in state.settings.stop), default=0)
        return next(iter(state.sessions.values())).committed_tail(row, longest)

    def drafters(self, state: DecodeState, row: int) -> list[int]:
        """Members that draft for this row this round (default: all that have the whole text)."""
        return in_step_members(state, row, list(state.sessions))

    def scorers(self, state: DecodeState) -> list[int]:
        return list(state.sessions)

    @abstractmethod
    def select(self, state: DecodeState, row: int, candidates: list[Candidate], scores: dict[int, list[float]]) -> int:
        """Index of the winning candidate (only called with two or more)."""

    def record(
        self,
        state: DecodeState,
        row: int,
        candidates: list[Candidate],
        winner: int,
        drafters: list[int],
        scores: dict[int, list[float]],
    ) -> None:
        self.rounds.append(
            {
                "row": row,
                "winner": [state.members[m].name for m in candidates[winner].proposers],
                "drafters": [state.members[m].name for m in drafters],
                "candidates": len(candidates),
            }
        )

    def stats(self) -> dict[str, Any]:
        return {"rounds": self.round_count, "per_round": list(self.rounds)}
