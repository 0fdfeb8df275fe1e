"""SAFE: ensemble only where it matters (docs/explanation/methods.md#safe).

Each round the drafter drafts up to `draft_len` pieces with its own cache (each piece is its own
choice: a token, or at a round's start a continuation that re-covers committed bytes). Every
verifier reads the drafted text (`MemberSession.read`) and gives its distribution at every piece
boundary, all in ONE forward. Walking the draft in order:

* a boundary where a verifier has no distribution (without boundary correction: it falls inside
  one of its tokens) is "OOV-like": the drafted piece stands;
* greedy: the position is skipped when every verifier's own choice is the drafted piece, or
  when sum_i w_i p_i(piece) > 1/2; either way the piece IS the ensemble's argmax (the paper's
  argument), so skipping loses nothing;
* otherwise the ensemble distribution (GaC or UniTE, sharpened when its top probability is
  below 1/2) decides; its pick is committed after the accepted prefix and the round ends (when
  it picks the drafted piece, the walk goes on);
* sampling (temperature > 0): the skip tests are greedy arguments, so instead each position is
  accepted with probability min(1, p_ens(t) / p_draft(t)), where p_draft is the top-p'd
  distribution the drafter drew from, and a rejection samples from the residual
  max(0, p_ens - p_draft) (speculative sampling: the output follows the top-p'd p_ens).

Which members write: the drafter keeps its drafted tokens that are committed. A verifier writes
a committed piece (keeps its own tokens) while it has agreed with every committed piece so far
(its own choice was that piece), so one model twice is that model alone; from its first
disagreement on it reads the rest of the reply as text it did not write (canonical tokens, and
the boundary-correct distribution at the end). Verifiers read each drafted piece as their own
where they still write (`read`'s `written`); when a verifier disagrees with a piece the walk goes
past (a position skipped by mass, or an ensemble that kept the draft), it re-reads the rest of
the draft as text it did not write (`SAFE.rereads`). The rule depends on positions only, never
on rounds, so every decision is made on exactly the state the verifier would have if each
position started a round: where a round ends (`draft_len`, `confident_drafts`) changes no text.
(A rule that lets a verifier write again after a disagreement, as GaC's members do, would make
a verifier's state at a round's start differ from its state at the same text inside a draft.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.constraints import Constraint
from ensemble_core.constraints.matcher import ConstraintState
from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import Continuations, DraftReading, MemberVocab, RequestId
from ensemble_core.members.own_choice import Choice, own_choice, pick_prob
from ensemble_core.methods.base import (
    Binding,
    Commit,
    DecodeState,
    Method,
    MethodRun,
    bind_all,
    check_flag,
    check_fraction,
    check_positive_int,
    check_weights,
    register,
    require_some,
    role_index,
)
from ensemble_core.methods.combine import Combiner, Scored, Step
from ensemble_core.methods.token import bound_union, first_token_of
from ensemble_core.methods.weighting import RequestWeights, named_weights
from ensemble_core.results import MethodStats
from ensemble_core.sampling import sample, top_p_filter, uniform
from ensemble_core.vocab.union import EOS_INDEX

_BASES = ("gac", "unite")
_SHARPEN = ("heuristic", "geometric", None)


@register("safe")
@dataclass(frozen=True)
class SAFE(Method):
    """Selective ensembling: a drafter writes, the others verify, the ensemble decides only
    where the members disagree.

    Args:
        drafter: the drafting member (name or unique prefix); default the first member.
        draft_len: pieces drafted per round (the paper's n = 5).
        base: the ensemble at a decided position: "gac" (full union) or "unite" (top-k union).
        sharpen: when the ensemble's top probability is below 1/2: "heuristic" (an entry the
            drafter has, above `sharpen_lambda`, gains the mass of every entry extending its
            text), "geometric" (weighted geometric mean over the top-k), or None.
        sharpen_lambda: the heuristic's threshold (the paper's 0.1), in (0, 1).
        weights: one per member (normalised); default equal; or "auto" / "prompt" / "agreement"
            (per-request weights that need no tuning, see `methods.weighting`).
        top_k: UniTE's k (base "unite" and the geometric variant).
        skip_tests: False turns both greedy skip tests off, so every position that is not
            OOV-like is decided by the ensemble (what GaC would pick there).
        record: keep a per-position trace in the stats (`decisions`; for analysis and tests).
        confident_drafts: end a draft early after a piece the drafter itself gives less than
            this probability: that position will most likely be ensembled and replaced, so
            drafting past it is wasted work. Every decision depends only on the text before its
            position, so this changes no text (tested), only the work. None drafts `draft_len`
            pieces always, as the paper does.
    """

    constraint_refusal = None  # every position is decided among allowed texts (docs/guides/constraints.md)

    drafter: str | None = None
    draft_len: int = 5
    base: str = "gac"
    sharpen: str | None = "heuristic"
    sharpen_lambda: float = 0.1
    finds_weights: ClassVar[bool] = True
    weights: tuple[float, ...] | None = None
    top_k: int = 10
    skip_tests: bool = True
    record: bool = False
    confident_drafts: float | None = 0.5

    def __post_init__(self) -> None:
        check_positive_int(self.draft_len, "draft_len")
        if self.base not in _BASES:
            raise ConfigError(f"`base` has to be one of {list(_BASES)}, but is {self.base!r}.")
        if self.sharpen not in _SHARPEN:
            raise ConfigError(f"`sharpen` has to be one of {list(_SHARPEN)}, but is {self.sharpen!r}.")
        value = check_fraction(self.sharpen_lambda, "sharpen_lambda", 0.0, 1.0, low_open=True, high_open=True)
        object.__setattr__(self, "sharpen_lambda", value)
        check_positive_int(self.top_k, "top_k")
        check_flag(self.skip_tests, "skip_tests")
        check_flag(self.record, "record")
        object.__setattr__(self, "weights", check_weights(self.weights))
        if self.confident_drafts is not None:
            value = check_fraction(self.confident_drafts, "confident_drafts", 0.0, 1.0, low_open=True, high_open=False)
            object.__setattr__(self, "confident_drafts", value)

    def check_member_count(self, count: int) -> None:
        if count < 2:
            raise ConfigError("SAFE needs at least two members: a drafter and a verifier.")

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        self.check_member_count(len(members))
        drafter = role_index(members, self.drafter, "drafter")
        return bind_all(self, members, self.weights, reference=drafter, roles={"drafter": drafter})

    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        combiner = Combiner(bound_union(binding), binding.members, binding.weights, device)
        return _SafeRun(self, binding, combiner, settings, RequestWeights(binding.weights, binding.rule))


@dataclass(frozen=True)
class SafeDecision:
    """One walked position (kept with `record=True`)."""

    round: int
    position: int
    draft: bytes
    decision: str  # skipped_agree | skipped_mass | ensembled | oov_like | accepted | resampled
    chosen: bytes


@dataclass
class SafeStats(MethodStats):
    """SAFE's figures for one prompt.

    Attributes:
        rounds: draft-verify rounds.
        drafted_tokens / committed_tokens: pieces drafted, and tokens committed.
        ensembled_positions: positions decided by the ensemble distribution.
        skipped_agree / skipped_mass: positions skipped because every verifier agreed, or
            because the drafted piece holds over half the weighted mass.
        oov_like: positions no verifier distribution was available for (the piece stood).
        ensemble_kept_draft: decided positions where the ensemble chose the drafted piece.
        rejected: sampling: drafted pieces the speculative test rejected.
        rereads: verifier re-reads after a disagreement the walk went past.
        weights: the member weights of the last decided position, by member name.
        decisions: the per-position trace (with `record=True`).
    """

    rounds: int = 0
    drafted_tokens: int = 0
    committed_tokens: int = 0
    ensembled_positions: int = 0
    skipped_agree: int = 0
    skipped_mass: int = 0
    oov_like: int = 0
    ensemble_kept_draft: int = 0
    rejected: int = 0
    rereads: int = 0
    union_size: int = 0
    weights: dict[str, float] = field(default_factory=dict)
    decisions: list[SafeDecision] = field(default_factory=list)

    @property
    def share_ensembled(self) -> float | None:
        return self.ensembled_positions / self.committed_tokens if self.committed_tokens else 0.0


@dataclass
class _Draft:
    """One request's draft: the drafter's choices, the distributions they came from."""

    choices: list[Choice] = field(default_factory=list)
    distributions: list[Continuations] = field(default_factory=list)
    done: bool = False

    @property
    def pieces(self) -> list[bytes]:
        """The texts of the drafted pieces (the end, if drafted, is not a piece)."""
        return [c.text for c in self.choices if not c.eos]


class _SafeRun(MethodRun):
    def __init__(
        self,
        method: SAFE,
        binding: Binding,
        combiner: Combiner,
        settings: GenerationSettings,
        weights: RequestWeights,
    ):
        self.method = method
        self.binding = binding
        self.combiner = combiner
        self.settings = settings
        self.weights = weights
        self.drafter = binding.roles["drafter"]
        self.verifiers = [m for m in binding.participants if m != self.drafter]
        self.counts: dict[RequestId, SafeStats] = {}
        # per request: the verifiers that have agreed with every committed piece (they still write)
        self.writers: dict[RequestId, dict[int, bool]] = {}

    def _stats(self, request: RequestId) -> SafeStats:
        if request not in self.counts:
            self.counts[request] = SafeStats(union_size=self.combiner.union.size)
        return self.counts[request]

    def constrain(self, constraint: Constraint) -> ConstraintState:
        return ConstraintState(constraint, self.combiner.union)

    def stats(self, request: RequestId) -> MethodStats:
        return self._stats(request)

    def drop(self, requests: Sequence[RequestId]) -> None:
        for request in requests:
            self.counts.pop(request, None)
            self.writers.pop(request, None)
        self.weights.drop(requests)

    def writers_of(self, request: RequestId) -> dict[int, bool]:
        return self.writers.setdefault(request, dict.fromkeys(self.verifiers, True))

    # ------------------------------------------------------------------ the round

    def step(self, state: DecodeState) -> dict[RequestId, Commit]:
        for request in state.requests:
            self._stats(request).rounds += 1

        # Position 0 is the committed text's end: every verifier's plain next-step distribution
        # (free when it wrote the last committed text: its logits are there already), found
        # while the drafter drafts (concurrently where they sit in different lanes).
        def opening(member: int) -> Any:
            return self._draft(state) if member == self.drafter else state.next_of(member, state.requests)

        firsts = state.each([self.drafter, *self.verifiers], opening)
        drafts: dict[RequestId, _Draft] = firsts.pop(self.drafter)
        walks = {r: _Walk(self, state, r, drafts[r], firsts) for r in state.requests}
        commits: dict[RequestId, Commit] = {}
        for request, walk in walks.items():
            outcome = walk.first()
            if outcome is not None:
                commits[request] = outcome
        rest = [r for r in state.requests if r not in commits]
        readings = self._read(state, {r: drafts[r].pieces for r in rest if walks[r].positions > 1}, walks)
        for request in rest:
            walk = walks[request]
            walk.readings = {v: readings[v][request] for v in readings if request in readings[v]}
            commits[request] = walk.rest()
        for request, commit in commits.items():
            self._stats(request).committed_tokens += commit.tokens
        return commits

    def _draft(self, state: DecodeState) -> dict[RequestId, _Draft]:
        session = state.sessions[self.drafter]
        vocab = state.members[self.drafter]
        drafts = {r: _Draft() for r in state.requests}
        budget = {r: min(self.method.draft_len, state.remaining[r]) for r in state.requests}
        while True:
            rows = [r for r in state.requests if not drafts[r].done and len(drafts[r].choices) < budget[r]]
            if not rows:
                return drafts
            found = state.next_of(self.drafter, rows)
            for request in rows:
                draft = drafts[request]
                distribution = found[request]
                if distribution is None:  # it cannot spell the committed text: the ensemble decides
                    draft.done = True
                    continue
                choice = own_choice(vocab, distribution, self.settings, state.generators.get(request))
                if choice.control:  # a control token has no text: the ensemble decides here
                    draft.distributions.append(distribution)
                    draft.done = True
                    continue
                draft.choices.append(choice)
                draft.distributions.append(distribution)
                self._stats(request).drafted_tokens += 1
                if choice.eos:
                    draft.done = True
                    continue
                session.write(request, distribution, choice.pick)
                confident = self.method.confident_drafts
                draft.done = confident is not None and choice.prob < confident

    def _read(
        self, state: DecodeState, pieces: dict[RequestId, list[bytes]], walks: dict[RequestId, _Walk]
    ) -> dict[int, dict[RequestId, DraftReading]]:
        """Each verifier reads the drafts of the requests still walking, in ONE forward: as its own
        pieces while it still writes (after position 0), else as text it did not write."""
        if not pieces:
            return {v: {} for v in self.verifiers}
        temperature = 1.0 if self.settings.greedy else self.settings.temperature
        requests = list(pieces)

        def reading(verifier: int) -> dict[RequestId, DraftReading]:
            written = [len(pieces[r]) if walks[r].writing[verifier] else 0 for r in requests]
            found = state.sessions[verifier].read(requests, [pieces[r] for r in requests], temperature, written)
            return dict(zip(requests, found, strict=True))

        return state.each(self.verifiers, reading)

    def reread(
        self, state: DecodeState, verifier: int, request: RequestId, pieces: list[bytes], written: int
    ) -> DraftReading:
        """A verifier's reading of a draft whose first `written` pieces it wrote and whose rest it did not."""
        self._stats(request).rereads += 1
        temperature = 1.0 if self.settings.greedy else self.settings.temperature
        return state.sessions[verifier].read([request], [pieces], temperature, written=[written])[0]

    # ------------------------------------------------------------------ helpers for the walk

    def ensemble(self, step: Step, state: DecodeState) -> Scored:
        if self.method.base == "unite":
            return step.unite(self.method.top_k, first_token_of(state))
        return step.full_scored()

    def sharpens(self, scored: Scored) -> bool:
        """Whether the ensemble's choice is sharpened: no candidate reaches one half."""
        if self.method.sharpen is None:
            return False
        best = max(scored.values) if scored.values is not None else float(scored.probs.max())
        return best < 0.5

    def sharpened(self, step: Step, scored: Scored) -> Scored:
        """The sharpened choices. Over GaC's full distribution, the entries above the threshold
        come from the shortcut's candidates wherever its bound rules out any other, so the full
        union (a hosted member's whole distribution) is read only where it cannot."""
        method = self.method
        if method.sharpen == "geometric":
            return step.sharpen_geometric(method.top_k)
        if method.base == "unite":
            sharpened = step.sharpen_heuristic(scored, self.drafter, method.sharpen_lambda, over_all=False)
        else:
            above = step.above(method.sharpen_lambda)
            if above is None:
                above = scored if len(scored.entries) == step.size else step.full_scored()
            sharpened = step.sharpen_heuristic(above, self.drafter, method.sharpen_lambda, over_all=True)
        return scored if sharpened is None else sharpened


def _allows(constraint: ConstraintState | None, drafted: Choice) -> bool:
    """Whether a drafted piece may be kept under the constraint (where the round has reached)."""
    if constraint is None:
        return True
    return constraint.allows_end() if drafted.eos else not drafted.control and constraint.allows(drafted.text)


class _Walk:
    """The walk over one request's draft (see the module docstring)."""

    def __init__(
        self,
        run: _SafeRun,
        state: DecodeState,
        request: RequestId,
        draft: _Draft,
        firsts: dict[int, dict[RequestId, Continuations | None]],
    ):
        self.run_ = run
        self.state = state
        self.request = request
        self.draft = draft
        self.firsts = {v: firsts[v][request] for v in run.verifiers}
        self.readings: dict[int, DraftReading] = {}
        self.stats = run._stats(request)
        self.writing = run.writers_of(request)  # verifiers still writing (agreed with every committed piece)
        self.pieces = draft.pieces
        self.positions = max(1, len(draft.distributions))  # an empty draft: the verifiers decide
        self.constraint = state.constraints.get(request)  # the request's, before this round

    def first(self) -> Commit | None:
        """Position 0; a commit when the walk ends there."""
        outcome = self._position(0)
        if outcome is None and self.positions == 1:
            return self._commit(len(self.draft.choices), None)
        return outcome

    def rest(self) -> Commit:
        for j in range(1, self.positions):
            outcome = self._position(j)
            if outcome is not None:
                return outcome
        return self._commit(len(self.draft.choices), None)

    def _distributions(self, j: int) -> dict[int, Continuations | None]:
        found: dict[int, Continuations | None] = {}
        if j < len(self.draft.distributions):
            found[self.run_.drafter] = self.draft.distributions[j]
        for verifier in self.run_.verifiers:
            if j == 0:
                found[verifier] = self.firsts[verifier]
            else:
                reading = self.readings.get(verifier)
                found[verifier] = reading.at[j] if reading is not None and j < len(reading.at) else None
        return found

    def _position(self, j: int) -> Commit | None:
        found = self._distributions(j)
        drafted = self.draft.choices[j] if j < len(self.draft.choices) else None
        present = [v for v in self.run_.verifiers if not self.state.sessions[v].lagging(self.request)]
        if drafted is not None and any(found[v] is None for v in present):
            self.stats.oov_like += 1
            self._trace(j, "oov_like", drafted.text)
            self._stop_writing_all()
            return None
        distributions = require_some(found, self.request)
        weights = self.run_.weights.of(self.request, self.state.weights.get(self.request))
        constraint = None if self.constraint is None else self.constraint.after(b"".join(self.pieces[:j]))
        step = self.run_.combiner.step(distributions, weights, constraint)
        draft_entry = None if drafted is None else self._entry(step, drafted)
        allowed = draft_entry is not None and _allows(constraint, drafted)  # type: ignore[arg-type]
        if draft_entry is not None and self.state.settings.greedy and self.run_.method.skip_tests and allowed:
            step.prefetch(np.asarray([draft_entry], dtype=np.int64))  # read with the members' choices
        if self.state.settings.greedy:
            entry, decision = self._greedy(step, draft_entry if allowed else None)
        else:
            entry, decision = self._sampled(step, j, draft_entry)  # (a rejected piece has no mass to keep)
        self._trace(j, decision, b"" if entry == EOS_INDEX else step.text(entry))
        self.run_.weights.observe(self.request, lambda: step.probabilities_of(entry))
        self.stats.weights = named_weights(self.state.members, step.weights)
        self._verifiers_write(step, found, entry)
        if drafted is not None and entry == draft_entry:
            if j > 0:
                self._reread_disagreeing(j)
            return None
        return self._commit(j, step.text(entry) if entry != EOS_INDEX else None, ends=entry == EOS_INDEX)

    def _entry(self, step: Step, drafted: Choice) -> int:
        if drafted.eos:
            return EOS_INDEX
        entry = step.pick_entry(self.run_.drafter, drafted.pick)
        return step.entry_of(drafted.text) if entry is None else entry

    def _greedy(self, step: Step, draft_entry: int | None) -> tuple[int, str]:
        run = self.run_
        if run.method.skip_tests and draft_entry is not None:
            if all(step.own(v).entry == draft_entry for v in run.verifiers):
                self.stats.skipped_agree += 1
                return draft_entry, "skipped_agree"
            if step.scores(np.asarray([draft_entry], dtype=np.int64))[0] > 0.5:
                self.stats.skipped_mass += 1
                return draft_entry, "skipped_mass"
        self.stats.ensembled_positions += 1
        if step.constraint is not None and run.method.base != "unite" and run.method.sharpen is None:
            chosen = step.greedy()[0]  # the constrained argmax (`Step.greedy`)
            self.stats.ensemble_kept_draft += chosen == draft_entry
            return chosen, "ensembled"
        # the exact top-k shortcut where it decides and no sharpening follows (its best is then
        # the full distribution's argmax); the full union otherwise
        scored = step.shortcut() if run.method.base != "unite" and step.constraint is None else None
        if scored is None:
            scored = run.ensemble(step, self.state)
        chosen = step.pick(run.sharpened(step, scored) if run.sharpens(scored) else scored)
        self.stats.ensemble_kept_draft += chosen == draft_entry
        return chosen, "ensembled"

    def _sampled(self, step: Step, j: int, draft_entry: int | None) -> tuple[int, str]:
        """Speculative sampling: keep the draft with probability min(1, p_ens / p_draft)."""
        run = self.run_
        generator = self.state.generators.get(self.request)
        self.stats.ensembled_positions += 1
        scored = run.ensemble(step, self.state)
        if step.constraint is not None:  # the allowed entries only, renormalised
            scored = step.constrained(scored, for_argmax=None)  # every allowed entry: drafts are tested against it
            scored = Scored(scored.entries, scored.probs / scored.probs.sum().clamp(min=1e-30), scored.listed)
        p_ens = top_p_filter(scored.probs, self.state.settings.top_p)
        if draft_entry is None:  # nothing drafted here: sample the ensemble
            return int(scored.entries[sample(p_ens, generator)]), "resampled"  # type: ignore[arg-type]
        drafter = run.drafter
        proposal_all = top_p_filter(self.draft.distributions[j].dense.float(), self.state.settings.top_p)
        drafted = self.draft.choices[j]
        proposal = (
            pick_prob(self.draft.distributions[j], drafted.pick)
            if drafted.pick.group != -1
            else float(proposal_all[drafted.pick.index])
        )
        where = (scored.entries == draft_entry).nonzero().flatten()
        target = float(p_ens[where[0]]) if len(where) else 0.0
        if proposal > 0 and uniform(generator) < min(1.0, target / proposal):  # type: ignore[arg-type]
            self.stats.ensemble_kept_draft += 1
            return draft_entry, "accepted"
        self.stats.rejected += 1
        p_draft = step.mass(drafter, scored.entries)
        p_draft = p_draft / p_draft.sum() if float(p_draft.sum()) > 0 else p_draft
        residual = (p_ens - p_draft).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:
            residual = p_ens
        return int(scored.entries[sample(residual / residual.sum(), generator)]), "resampled"  # type: ignore[arg-type]

    # ------------------------------------------------------------------ writers and re-reads

    def _verifiers_write(self, step: Step, found: dict[int, Continuations | None], entry: int) -> None:
        """Verifiers that still write and whose own choice at this position is the committed entry
        write it; any other stops writing for the rest of the reply (see the module docstring)."""
        for verifier in self.run_.verifiers:
            distribution = found.get(verifier)
            if not self.writing[verifier] or distribution is None or entry == EOS_INDEX:
                self.writing[verifier] = False
                continue
            own = step.own(verifier)
            if own.entry != entry or not self.state.sessions[verifier].write(self.request, distribution, own.pick):
                self.writing[verifier] = False

    def _stop_writing_all(self) -> None:
        for verifier in self.writing:
            self.writing[verifier] = False

    def _reread_disagreeing(self, j: int) -> None:
        """A verifier whose reading took piece j as its own but that did not write it reads the
        rest of the draft again, as text it did not write (boundary correction; see `read`)."""
        if j + 1 >= len(self.draft.distributions):
            return
        for verifier in self.run_.verifiers:
            reading = self.readings[verifier]
            if self.writing[verifier] or reading.written <= j:
                continue
            fresh = self.run_.reread(self.state, verifier, self.request, self.pieces, j)
            self.readings[verifier] = DraftReading(reading.at[: j + 1] + fresh.at[j + 1 :], written=j)

    # ------------------------------------------------------------------ results

    def _commit(self, accepted: int, own_text: bytes | None, ends: bool = False) -> Commit:
        """The accepted draft prefix, then the ensemble's own entry (if the walk stopped)."""
        choices = self.draft.choices[:accepted]
        ended = bool(choices) and choices[-1].eos
        text = b"".join(c.text for c in choices)
        tokens = len(choices)
        if own_text is not None or ends:
            text += own_text or b""
            ended = ends
            tokens += 1
        return Commit(text=text, eos=ended, tokens=max(tokens, 1))

    def _trace(self, j: int, decision: str, chosen: bytes) -> None:
        if not self.run_.method.record:
            return
        drafted = self.draft.choices[j].text if j < len(self.draft.choices) else b""
        self.stats.decisions.append(SafeDecision(self.stats.rounds, j, drafted, decision, chosen))
