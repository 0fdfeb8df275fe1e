"""SAFE: ensemble only where it matters (ALGORITHMS.md section 3).

Each round the drafter drafts up to `draft_len` tokens with its own cache. Every verifier
reads the drafted text in its own tokens (appended speculatively after its committed ids)
and scores every drafted position in ONE forward. Walking the draft in order:

* a position whose start is not a token boundary for some verifier is "OOV-like": it cannot
  be ensembled and the drafted token stands;
* greedy: the position is skipped when every verifier's own top token agrees with the draft,
  or when sum_i w_i p_i(draft token) > 1/2; either way the draft token IS the ensemble's
  argmax (the paper's argument), so skipping loses nothing;
* otherwise the ensemble distribution (GaC or UniTE over the union, sharpened when its top
  probability is below 1/2) decides. If it picks the drafted token the walk goes on (the rest
  of the draft is still a valid continuation: a small improvement over stopping); else its
  pick is committed after the accepted prefix and the round ends;
* sampling (temperature > 0): the skip tests are greedy arguments, so instead each position
  is accepted with probability min(1, p_ens(t) / p_draft(t)), and a rejection samples from
  the residual max(0, p_ens - p_draft) (speculative sampling: the output follows p_ens).

Rollback costs nothing extra: the drafter keeps its cache for the accepted prefix, and the
verifiers' speculative ids that match the committed text are kept with theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.members.text_sync import MemberSession
from ensemble_core.methods.base import Commit, DecodeState, EnsembleMethod, MethodRun, member_index, register
from ensemble_core.methods.combine import Combiner, Scored, first_tokens_of
from ensemble_core.methods.token import union_for
from ensemble_core.sampling import sample, top_p_filter
from ensemble_core.union import EOS_INDEX

# per verifier, per row: byte offset after the committed text -> index of the verifier's token
# whose next-token logits are its distribution at that offset
Boundaries = dict[int, list[dict[int, int]]]

_BASES = ("gac", "unite")
_SHARPEN = ("heuristic", "geometric", None)


@register("safe")
class SAFE(EnsembleMethod):
    """Selective ensembling: a drafter writes, the others verify, the ensemble decides only
    where the members disagree.

    Args:
        drafter: the drafting member (name or unique prefix); default the first member.
        draft_len: tokens drafted per round (the paper's n = 5).
        base: the ensemble at a decided position: "gac" (full union) or "unite" (top-k union).
        sharpen: when the ensemble's top probability is below 1/2: "heuristic" (an entry the
            drafter has, above `sharpen_lambda`, gains the mass of every entry extending its
            text), "geometric" (weighted geometric mean over the top-k), or None.
        sharpen_lambda: the heuristic's threshold (the paper's 0.1), in (0, 1).
        weights: one per member (normalised); default equal.
        top_k: UniTE's k (base "unite" and the geometric variant).
        skip_tests: False turns both greedy skip tests off, so every position that is not
            OOV-like is decided by the ensemble (what GaC would pick there).
        record: keep a per-position trace in `stats["decisions"]` (for analysis and tests).
        confident_drafts: end a draft early after a token the drafter itself gives less than
            this probability: that position will most likely be ensembled and replaced, so
            drafting past it is wasted work. It changes no decision (each position is judged on
            its own prefix), only the work. None drafts `draft_len` tokens always, as the paper.
    """

    def __init__(
        self,
        drafter: str | None = None,
        draft_len: int = 5,
        base: str = "gac",
        sharpen: str | None = "heuristic",
        sharpen_lambda: float = 0.1,
        weights: Sequence[float] | None = None,
        top_k: int = 10,
        skip_tests: bool = True,
        record: bool = False,
        confident_drafts: float | None = 0.5,
    ):
        if isinstance(draft_len, bool) or not isinstance(draft_len, int) or draft_len < 1:
            raise ConfigError(f"`draft_len` has to be a positive integer, but is {draft_len!r}.")
        if base not in _BASES:
            raise ConfigError(f"`base` has to be one of {list(_BASES)}, but is {base!r}.")
        if sharpen not in _SHARPEN:
            raise ConfigError(f"`sharpen` has to be one of {list(_SHARPEN)}, but is {sharpen!r}.")
        if not 0.0 < float(sharpen_lambda) < 1.0:
            raise ConfigError(f"`sharpen_lambda` has to be in (0, 1), but is {sharpen_lambda}.")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"`top_k` has to be a positive integer, but is {top_k!r}.")
        if confident_drafts is not None and not 0.0 < float(confident_drafts) <= 1.0:
            raise ConfigError(f"`confident_drafts` has to be in (0, 1] or None, but is {confident_drafts}.")
        self.confident_drafts = confident_drafts
        self.drafter = drafter
        self.draft_len = draft_len
        self.base = base
        self.sharpen = sharpen
        self.sharpen_lambda = float(sharpen_lambda)
        super().__init__(weights)
        self.top_k = top_k
        self.skip_tests = skip_tests
        self.record = record
        self._drafter_index = 0

    def bind(self, members: Sequence[Member]) -> None:
        if len(members) < 2:
            raise ConfigError("SAFE needs at least two members: a drafter and a verifier.")
        super().bind(members)
        self._drafter_index = 0 if self.drafter is None else member_index(members, self.drafter, "drafter")

    def reference_member(self, members: Sequence[Member]) -> int:
        return self._drafter_index

    def start(self, members: Sequence[Member], settings: GenerationSettings) -> MethodRun:
        return _SafeRun(self, members, Combiner(union_for(members), self.member_weights), settings)

    def __repr__(self) -> str:
        return (
            f"SAFE(drafter={self.drafter!r}, draft_len={self.draft_len}, base={self.base!r}, "
            f"sharpen={self.sharpen!r}, sharpen_lambda={self.sharpen_lambda}, "
            f"confident_drafts={self.confident_drafts})"
        )


@dataclass
class _Draft:
    """One row's draft: drafter ids (an end-of-sequence id last, if drafted), their bytes,
    and the drafter's (tempered) distribution at each position."""

    ids: list[int] = field(default_factory=list)
    texts: list[bytes] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    ended: bool = False  # an end-of-sequence token was drafted
    done: bool = False  # no more drafting this round (ended, or the drafter grew unsure)

    def offset(self, position: int) -> int:
        """Bytes of draft before `position` (relative to the committed text)."""
        return sum(len(t) for t in self.texts[:position])


@dataclass
class _Counts:
    rounds: int = 0
    drafted: int = 0
    committed: int = 0
    oov_like: int = 0
    skipped_agree: int = 0
    skipped_mass: int = 0
    ensembled: int = 0
    ensemble_kept_draft: int = 0
    rejected: int = 0


class _SafeRun(MethodRun):
    def __init__(self, method: SAFE, members: Sequence[Member], combiner: Combiner, settings: GenerationSettings):
        self.method = method
        self.members = members
        self.combiner = combiner
        self.settings = settings
        self.drafter = method._drafter_index
        self.verifiers = [m for m in range(len(members)) if m != self.drafter]
        self.temperature = 1.0 if settings.greedy else settings.temperature
        self.counts = _Counts()
        self.decisions: list[dict[str, Any]] = []
        self._sessions: dict[int, MemberSession] = {}

    # ------------------------------------------------------------------ the round

    def step(self, state: DecodeState) -> list[Commit]:
        self._sessions = state.sessions
        self.counts.rounds += 1
        drafts = self._draft(state)
        boundaries = self._verify(state, drafts)
        commits = [self._decide(state, row, drafts[row], boundaries) for row in range(state.rows)]
        self.counts.committed += sum(c.tokens for c in commits)
        return commits

    def _draft(self, state: DecodeState) -> list[_Draft]:
        session = state.sessions[self.drafter]
        member = self.members[self.drafter]
        drafts = [_Draft() for _ in range(state.rows)]
        # A drafter that cannot spell a split character holds it back; it cannot draft after
        # text it does not have, so those rows take one plain ensemble step instead.
        budget = [0 if session.held(r) else min(self.method.draft_len, left) for r, left in enumerate(state.remaining)]
        while True:
            rows = [r for r in range(state.rows) if not drafts[r].done and len(drafts[r].ids) < budget[r]]
            if not rows:
                return drafts
            logits = session.next_logits(rows)
            for k, row in enumerate(rows):
                probs = self._member_probs(logits[k])
                token = self._draw(probs, state.generators[row])
                draft = drafts[row]
                if token not in member.eos_token_ids and member.table.token_bytes[token] is None:
                    draft.done = True  # a control token (`<|im_start|>`) has no text: the ensemble decides here
                    continue
                draft.ids.append(token)
                draft.probs.append(probs)
                self.counts.drafted += 1
                confident = self.method.confident_drafts
                if token in member.eos_token_ids:
                    draft.texts.append(b"")
                    draft.ended = draft.done = True
                else:
                    draft.texts.append(member.table.spell([token]))
                    session.speculate(row, [token])
                    draft.done = confident is not None and float(probs[token]) < confident

    def _member_probs(self, logits: torch.Tensor) -> torch.Tensor:
        probs = self.combiner.member_probs(logits, self.temperature)
        return probs if self.settings.greedy else top_p_filter(probs, self.settings.top_p)

    def _draw(self, probs: torch.Tensor, generator: torch.Generator | None) -> int:
        return int(torch.argmax(probs)) if generator is None else sample(probs, generator)

    def _verify(self, state: DecodeState, drafts: list[_Draft]) -> Boundaries:
        """Each verifier reads every row's draft in its own tokens, all scored in ONE forward.

        Returns, per verifier, per row: {byte offset after the committed text: token index
        whose next-token logits are the verifier's distribution at that offset}.
        """
        found: Boundaries = {}
        for verifier in self.verifiers:
            session = state.sessions[verifier]
            per_row = []
            for row, draft in enumerate(drafts):
                synced = session.synced_length(row)
                if session.batch.logits_after(row, synced - 1) is None:
                    session.batch.truncate(row, synced)  # re-run the last token inside this same forward
                held = session.held(row)
                ids = session.encoder.encode(held + b"".join(draft.texts))
                session.speculate(row, ids)
                offsets = {} if held else {0: synced - 1}
                position = -len(held)
                for index, token in enumerate(ids):
                    position += len(session.table.token_bytes[token] or b"")
                    if position >= 0:
                        offsets[position] = synced + index
                per_row.append(offsets)
            session.batch.forward_pending(keep_all=True)
            found[verifier] = per_row
        return found

    # ------------------------------------------------------------------ the walk

    def _decide(self, state: DecodeState, row: int, draft: _Draft, boundaries: Boundaries) -> Commit:
        generator = state.generators[row]
        if not draft.ids:
            return self._verifiers_only_step(row, boundaries, generator)
        drafter_map = self.combiner.union.maps[self.drafter]
        for position, token in enumerate(draft.ids):
            offset = draft.offset(position)
            draft_entry = int(drafter_map.to_union[token])
            probs = self._distributions(row, draft, position, offset, boundaries)
            if probs is None:
                self.counts.oov_like += 1
                self._trace(row, draft, position, "oov_like", draft_entry, offset, boundaries)
                continue
            if self.settings.greedy:
                chosen = self._greedy_position(probs, draft_entry)
                decision = chosen[1]
                self._trace(row, draft, position, decision, chosen[0], offset, boundaries)
                if chosen[0] == draft_entry:
                    continue
                return self._commit(draft, position, chosen[0])
            entry = self._sampled_position(probs, draft, position, draft_entry, generator)
            if entry == draft_entry:
                self._trace(row, draft, position, "accepted", entry, offset, boundaries)
                continue
            self._trace(row, draft, position, "resampled", entry, offset, boundaries)
            return self._commit(draft, position, entry)
        return self._commit(draft, len(draft.ids), None)

    def _distributions(
        self, row: int, draft: _Draft, position: int, offset: int, boundaries: Boundaries
    ) -> dict[int, torch.Tensor] | None:
        """Every member's distribution at this draft position, or None where it is OOV-like."""
        probs = {self.drafter: draft.probs[position]}
        for verifier in self.verifiers:
            index = boundaries[verifier][row].get(offset)
            logits = None if index is None else self._sessions[verifier].batch.logits_after(row, index)
            if logits is None:
                return None
            probs[verifier] = self._member_probs(logits)
        return probs

    def _greedy_position(self, probs: dict[int, torch.Tensor], draft_entry: int) -> tuple[int, str]:
        if self.method.skip_tests:
            if all(self.combiner.top_entry(v, probs[v])[1] == draft_entry for v in self.verifiers):
                self.counts.skipped_agree += 1
                return draft_entry, "skipped_agree"
            entry = torch.tensor([draft_entry])
            if float(self.combiner.score(probs, entry)[0]) > 0.5:
                self.counts.skipped_mass += 1
                return draft_entry, "skipped_mass"
        self.counts.ensembled += 1
        scored = self._ensemble(probs)
        preferred = self.combiner.preferred(probs)
        chosen = self.combiner.pick(scored, preferred)
        if self.method.sharpen is not None and float(scored.probs.max()) < 0.5:
            chosen = self.combiner.pick(self._sharpened(probs, scored), preferred)
        self.counts.ensemble_kept_draft += chosen == draft_entry
        return chosen, "ensembled"

    def _ensemble(self, probs: dict[int, torch.Tensor]) -> Scored:
        if self.method.base == "unite":
            return self.combiner.unite(probs, self.method.top_k, first_tokens_of(self._sessions))
        return Scored(torch.arange(self.combiner.union.size), self.combiner.full(probs))

    def _sharpened(self, probs: dict[int, torch.Tensor], scored: Scored) -> Scored:
        if self.method.sharpen == "geometric":
            return self.combiner.sharpen_geometric(probs, self.method.top_k)
        return self.combiner.sharpen_heuristic(scored, self.drafter, self.method.sharpen_lambda)

    def _sampled_position(
        self,
        probs: dict[int, torch.Tensor],
        draft: _Draft,
        position: int,
        draft_entry: int,
        generator: torch.Generator | None,
    ) -> int:
        """Speculative sampling: keep the draft with probability min(1, p_ens / p_draft)."""
        self.counts.ensembled += 1
        scored = self._ensemble(probs)
        p_ens = scored.probs / scored.probs.sum()
        p_ens = top_p_filter(p_ens, self.settings.top_p)
        p_draft = self.combiner.mass(self.drafter, draft.probs[position], scored.entries)
        where = (scored.entries == draft_entry).nonzero().flatten()
        target = float(p_ens[where[0]]) if len(where) else 0.0
        proposal = float(p_draft[where[0]]) if len(where) else 0.0
        if proposal > 0 and float(torch.rand((), generator=generator)) < min(1.0, target / proposal):
            self.counts.ensemble_kept_draft += 1
            return draft_entry
        self.counts.rejected += 1
        residual = (p_ens - p_draft).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:
            residual = p_ens
        return int(scored.entries[sample(residual / residual.sum(), generator)])  # type: ignore[arg-type]

    def _verifiers_only_step(self, row: int, boundaries: Boundaries, generator: torch.Generator | None) -> Commit:
        probs = {}
        for verifier in self.verifiers:
            index = boundaries[verifier][row].get(0)
            logits = None if index is None else self._sessions[verifier].batch.logits_after(row, index)
            if logits is not None:
                probs[verifier] = self._member_probs(logits)
        if not probs:
            raise RuntimeError("no member can continue the committed text (all hold back a split character)")
        self.counts.ensembled += 1
        scored = self._ensemble(probs)
        entry = self.combiner.choose(scored, self.settings, generator, self.combiner.preferred(probs))
        return self._commit(_Draft(), 0, entry)

    # ------------------------------------------------------------------ results

    def _commit(self, draft: _Draft, accepted: int, entry: int | None) -> Commit:
        """The accepted draft prefix, then the ensemble's own entry (if the walk stopped)."""
        ended = draft.ended and accepted == len(draft.ids)
        text = b"".join(draft.texts[:accepted])
        tokens = accepted
        if entry is not None:
            ended = entry == EOS_INDEX
            text += b"" if ended else self.combiner.union.entries[entry]
            tokens += 1
        own = [t for t in draft.ids[:accepted] if t not in self.members[self.drafter].eos_token_ids]
        return Commit(text=text, eos=ended, tokens=tokens, proposals={self.drafter: own})

    def _trace(
        self,
        row: int,
        draft: _Draft,
        position: int,
        decision: str,
        entry: int,
        offset: int,
        boundaries: Boundaries,
    ) -> None:
        if not self.method.record:
            return
        contexts = {}
        drafter_session = self._sessions[self.drafter]
        contexts[self.members[self.drafter].name] = drafter_session.batch.ids(row)[
            : drafter_session.synced_length(row) + position
        ]
        for verifier in self.verifiers:
            index = boundaries[verifier][row].get(offset)
            if index is not None:
                contexts[self.members[verifier].name] = self._sessions[verifier].batch.ids(row)[: index + 1]
        self.decisions.append(
            {
                "row": row,
                "round": self.counts.rounds,
                "position": position,
                "draft": self.combiner.union.entries[
                    int(self.combiner.union.maps[self.drafter].to_union[draft.ids[position]])
                ],
                "decision": decision,
                "chosen": self.combiner.union.entries[entry],
                "contexts": contexts,
            }
        )

    def stats(self) -> dict[str, Any]:
        counts = self.counts
        figures: dict[str, Any] = {
            "union_size": self.combiner.union.size,
            "rounds": counts.rounds,
            "drafted_tokens": counts.drafted,
            "committed_tokens": counts.committed,
            "ensembled_positions": counts.ensembled,
            "share_ensembled": counts.ensembled / counts.committed if counts.committed else 0.0,
            "skipped_agree": counts.skipped_agree,
            "skipped_mass": counts.skipped_mass,
            "oov_like": counts.oov_like,
            "ensemble_kept_draft": counts.ensemble_kept_draft,
            "rejected": counts.rejected,
        }
        if self.method.record:
            figures["decisions"] = list(self.decisions)
        return figures
