"""Combining members' next-step distributions over one set of candidate texts.

Shared by every token-level method (GaC, UniTE, SAFE): the full weighted distribution, the EXACT
greedy shortcut over top-k candidates, UniTE's top-k restricted distribution, the tie rule,
SAFE's sharpening, and the choice (argmax or seeded sample).

Candidates are texts (bytes a member would add after the committed text). A member's whole
tokens land in the union vocabulary (`vocab.union`) through its index map; candidates from
tokens that re-cover committed bytes (prompt-boundary correction) are texts that may or may not
be union entries: those that are not get a per-step entry past the union (`Step.text`).

Where the combination happens: every step's member distributions are moved ONCE to the
combining device (the `Ensemble` picks it: the device of the method's reference member), and
the union's index maps live there (moved once per device, see `MemberMap.on`).

Tie rule (the same on every path, so a method that skips work picks what the full computation
would): among entries with exactly the highest score, the own choice of the member with the
largest weight wins (the first such member); otherwise the entry with the smallest text (in
byte order: among union entries, the lowest entry). With one member at weight 1, or the same
model twice, this reproduces that member's own greedy choice even when its top two candidates
tie. Texts decide, not this step's own entry numbers, because those are given in the order texts
turn up, which depends on how much of a hosted member's partial groups crossed the wire; for the
same reason every set of scored entries a method may sample from is in text order.

GPU-ready: a step reads its device values to Python about twice. Each member's `Summary` (its
top-k, its total, its own greedy choice) is computed on the combining device and read in ONE
read for all members (`members.own_choice.summarize`); the shortcut's candidates are then known
on the host, are scored on the device (masses by gathers; ids sharing an entry and partial
candidates added in float64 in a fixed order, never by racing atomics) and read once; the
decision and the tie rule run on the host. Host bookkeeping (index maps, partial candidates'
entries and masses) is numpy, so every torch read left is a device read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import GenerationError
from ensemble_core.members.contract import Continuations, MemberVocab, Pick
from ensemble_core.members.own_choice import Summary, greedy_choice, summarize
from ensemble_core.sampling import sample, top_p_filter
from ensemble_core.vocab.union import EOS_INDEX, MemberMap, UnionVocab
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

if TYPE_CHECKING:
    from ensemble_core.constraints.matcher import ConstraintState

# Greedy shortcut: candidates are each member's top-k; k = 32 decides exactly in nearly every
# step (docs/explanation/methods.md#gac) and costs a fraction of a millisecond.
SHORTCUT_TOP_K = 32
_CHECK_ALL = 64  # a step's own texts checked one by one up to this many (see `Step.allowed`)
_REJECTIONS = 8  # draws of own texts the grammar rejects before all of them are checked
_BOUND_SLACK = 1e-6  # float32 sums of probabilities are not exactly 1
_READ_WHOLE = 4096  # a scored set up to this size is read whole and decided on the host

FirstToken = Callable[[int, bytes], "int | None"]  # (member, text) -> its first token of that text


@dataclass
class Scored:
    """Entries with their combined probability (a sub-distribution or the full one), or with
    scores to rank them by (contrastive decoding's float64 log-scores).

    `listed` / `values`: the same entries and probabilities as host data, where they are known
    without a read (a short list the host built, or read once); `pick` then decides on the host."""

    entries: torch.Tensor  # LongTensor [n]
    probs: torch.Tensor  # float32 [n] (float64 for scores)
    listed: np.ndarray | None = None
    values: list[float] | None = None

    def host_entries(self) -> np.ndarray:
        """The entries as host data (read once if only the device has them)."""
        if self.listed is None:
            self.listed = self.entries.cpu().numpy()
        return self.listed

    def host_values(self) -> list[float]:
        """The probabilities as host data (read once)."""
        if self.values is None:
            self.values = self.probs.tolist()
        return self.values


@dataclass(frozen=True)
class OwnChoice:
    """A member's own greedy choice in a step: its pick, the entry of its text, and its mass."""

    pick: Pick
    entry: int
    mass: float


class Combiner:
    """Weighted combinations of member distributions, built for one generation.

    Args:
        union: the members' union vocabulary.
        members: every member's static facts (by member index).
        weights: one non-negative weight per member, summing to 1.
        device: where distributions are combined.
    """

    def __init__(
        self, union: UnionVocab, members: Sequence[MemberVocab], weights: Sequence[float], device: torch.device
    ):
        self.union = union
        self.members = members
        self.weights = list(weights)
        self.device = device
        self.maps: list[MemberMap] = [m.on(device) for m in union.maps]

    def step(
        self,
        distributions: Mapping[int, Continuations],
        weights: Sequence[float] | None = None,
        constraint: ConstraintState | None = None,
    ) -> Step:
        """The members' distributions for one position of one request, ready to combine (with
        that request's own weights when it has them, e.g. from `weights="auto"`, and under its
        constraint when its reply is constrained: then only allowed entries are chosen)."""
        return Step(self, distributions, weights, constraint)


class Step:
    """Member distributions at one position, moved to the combining device, with every
    candidate text given an entry (a union index, or a per-step index past the union)."""

    def __init__(
        self,
        combiner: Combiner,
        distributions: Mapping[int, Continuations],
        weights: Sequence[float] | None = None,
        constraint: ConstraintState | None = None,
    ):
        self.c = combiner
        self.constraint = constraint
        self.weights = list(combiner.weights if weights is None else weights)
        self.union = combiner.union
        # every member's distribution on the combining device (moved once; a hosted member's
        # stays a summary there, see `Continuations.top`)
        self.raw = {m: d.on(combiner.device) for m, d in distributions.items()}
        self._dynamic: dict[bytes, int] = {}
        self._dynamic_texts: list[bytes] = []
        # member -> (sorted entries, float64 masses) of its partial candidates (texts from tokens
        # re-covering committed bytes) known here: all of them, except for a hosted member whose
        # large groups crossed as their most likely candidates and a bound on the rest
        self.partial = {m: self._partial_masses(m, d) for m, d in self.raw.items()}
        self._in_part = {m for m, d in self.raw.items() if not all(g.complete for g in d.partial)}
        self._partial_sets: dict[int, set[int]] = {}
        self._summaries: dict[int, Summary] | None = None
        self._asked: list[torch.Tensor] = []  # 1-D tensors to read with the summaries
        self._answers: list[list[float]] = []
        self._scores_at: dict[bytes, int] = {}  # prefetched entries -> where their scores are asked
        self._own: dict[int, OwnChoice] = {}
        self._shortlisted: tuple[Scored, float] | None = None

    # ------------------------------------------------------------------ the one read

    @property
    def summaries(self) -> dict[int, Summary]:
        """Every member's top-k, total and own choice, read once for them all (with whatever was
        asked for before: `prefetch`, `read_with_summaries`)."""
        if self._summaries is None:
            members = list(self.raw)
            items = [(self.c.members[m], self.raw[m]) for m in members]
            found, self._answers = summarize(items, SHORTCUT_TOP_K, self._asked)
            self._summaries = dict(zip(members, found, strict=True))
        return self._summaries

    def read_with_summaries(self, values: torch.Tensor) -> list[float]:
        """A 1-D tensor's values, in the same read as the summaries where those are not read yet
        (a method's own numbers and the members' choices then cost one sync together)."""
        if self._summaries is not None:
            return values.tolist()
        self._asked.append(values)
        self.summaries  # noqa: B018 - the read
        return self._answers[len(self._asked) - 1]

    def prefetch(self, listed: np.ndarray) -> None:
        """These entries' combined scores will be needed: they are read with the summaries (when
        those are read already, `scores` reads them on its own)."""
        if self._summaries is None:
            self._scores_at[listed.tobytes()] = len(self._asked)
            self._asked.append(self.score(listed))

    def scores(self, listed: np.ndarray) -> list[float]:
        """The entries' combined scores as host data (prefetched, or one read now)."""
        self.summaries  # noqa: B018 - reads whatever was prefetched, with the summaries
        at = self._scores_at.get(listed.tobytes())
        return self.score(listed).tolist() if at is None else self._answers[at]

    # ------------------------------------------------------------------ entries

    @property
    def size(self) -> int:
        """Entries in this step: the union's, the union's "nowhere" slot, then this step's own."""
        return self.union.size + 1 + len(self._dynamic_texts)

    @property
    def nowhere(self) -> int:
        """The slot of ids that are not text (control tokens, padded logit rows): never chosen."""
        return self.union.size

    def text(self, entry: int) -> bytes:
        if entry < self.union.size:
            return self.union.entries[entry]
        if entry == self.nowhere:
            raise ValueError("the 'nowhere' slot has no text")
        return self._dynamic_texts[entry - self.union.size - 1]

    def entry_of(self, text: bytes) -> int:
        """The entry of a candidate text (made for this step if the union lacks it)."""
        found = self.union.index_of(text)
        return found if found is not None else self._own_entries([text])[0]

    def _own_entries(self, texts: list[bytes]) -> list[int]:
        """This step's entries for texts the union lacks (known to be missing: no search)."""
        base, known, listed = self.union.size + 1, self._dynamic, self._dynamic_texts
        made = []
        for text in texts:  # thousands per step after a committed space: kept to plain dict work
            entry = known.get(text)
            if entry is None:
                entry = known[text] = base + len(listed)
                listed.append(text)
            made.append(entry)
        return made

    def _partial_masses(self, member: int, distribution: Continuations) -> tuple[np.ndarray, np.ndarray]:
        """(sorted entries, float64 masses) of the member's partial candidates, as host data:
        texts of tokens that re-cover committed bytes, each group mapped with one array lookup
        (a group can hold tens of thousands of candidates: after a committed space, every
        space-led token). The groups' ids and probabilities are read once, all together."""
        if not distribution.partial:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        table = self.c.members[member].table
        found_entries, found_masses = [], []
        for group, (ids, group_probs) in zip(distribution.partial, distribution.host_groups(), strict=True):
            probs = group_probs.astype(np.float64)
            suffixes = table.suffixes(group.skip).ids
            keep = (probs > 0) & (ids < len(suffixes))
            text_ids, probs = suffixes[ids[keep]], probs[keep]
            valid = text_ids >= 0
            text_ids, probs = text_ids[valid], probs[valid]
            entries = self.union.suffix_entries(member, group.skip, table)[text_ids]
            missing = entries < 0
            if missing.any():  # texts no member has as a whole token: this step's own entries
                unique, inverse = np.unique(text_ids[missing], return_inverse=True)
                texts = table.suffixes(group.skip).texts
                made = self._own_entries([texts[t] for t in unique.tolist()])
                entries[missing] = np.asarray(made, dtype=np.int64)[inverse]
            found_entries.append(entries)
            found_masses.append(probs)
        unique, inverse = np.unique(np.concatenate(found_entries), return_inverse=True)
        masses = np.zeros(len(unique), dtype=np.float64)
        np.add.at(masses, inverse, np.concatenate(found_masses))  # in candidate order, as a loop adds
        return unique, masses

    def pick_entry(self, member: int, pick: Pick) -> int | None:
        """The entry a member's candidate lands on (None: a control token, no text)."""
        if pick.group == -1:
            target = int(self.union.maps[member].host_to_union[pick.index])
            return None if target == self.nowhere else target
        group = self.raw[member].partial[pick.group]
        spelled = self.c.members[member].table.token_bytes[group.token(pick.index)] or b""
        return self.entry_of(spelled[group.skip :])

    def _partial_values(self, member: int, listed: np.ndarray) -> np.ndarray:
        """float64 [n]: the member's partial mass on each entry of `listed` (host data)."""
        if member in self._in_part:
            return self._asked_partial_values(member, listed)
        values = np.zeros(len(listed), dtype=np.float64)
        partial_entries, partial_masses = self.partial[member]
        if len(partial_entries):
            at = np.searchsorted(partial_entries, listed).clip(max=len(partial_entries) - 1)
            hit = partial_entries[at] == listed
            values[hit] = partial_masses[at[hit]]
        return values

    def _asked_partial_values(self, member: int, listed: np.ndarray) -> np.ndarray:
        """`_partial_values` where some group is known only in part: each group's probability of
        each listed text, added group by group in group order (the sums the whole groups give),
        the group asked only for the tokens it did not send."""
        table = self.c.members[member].table
        texts = [b"" if e in (EOS_INDEX, self.nowhere) else self.text(e) for e in listed.tolist()]
        total = np.zeros(len(texts), dtype=np.float64)
        for group in self.raw[member].partial:
            ids, _ = group.known()
            if not len(ids):
                continue
            head = (table.token_bytes[int(ids[0])] or b"")[: group.skip]  # the committed bytes it re-covers
            spellings = [table.ids_by_bytes.get(head + text, ()) if text else () for text in texts]
            probs = iter(group.probs_of([token for tokens in spellings for token in tokens]))
            sums = [0.0] * len(texts)
            for position, tokens in enumerate(spellings):
                for _ in tokens:
                    sums[position] += next(probs)
            total += np.asarray(sums, dtype=np.float64)
        return total

    def _unknown_partial_bound(self, member: int) -> float:
        """The most partial mass any entry the member's known candidates lack can have."""
        sharing = self.c.maps[member].ids_per_entry  # ids with the same bytes give one text
        return sum(min(g.unknown_bound * sharing, g.unknown_mass) for g in self.raw[member].partial if not g.complete)

    def _complete(self, member: int) -> None:
        """Every partial candidate of the member known here (a hosted member's groups fetched whole)."""
        if member not in self._in_part:
            return
        for group in self.raw[member].partial:
            group.token_ids  # noqa: B018 - fetched once, then the group is complete
        self.partial[member] = self._partial_masses(member, self.raw[member])
        self._in_part.discard(member)
        self._partial_sets.pop(member, None)

    def in_text_order(self, entries: np.ndarray) -> np.ndarray:
        """Sorted entries (union entries are in text order) with this step's own ones merged in by text."""
        entries = np.unique(entries)
        if not len(entries) or entries[-1] <= self.nowhere:
            return entries
        return np.asarray(sorted(entries.tolist(), key=self.text), dtype=np.int64)

    def _partial_set(self, member: int) -> set[int]:
        if member not in self._partial_sets:
            self._partial_sets[member] = set(self.partial[member][0].tolist())
        return self._partial_sets[member]

    def device_entries(self, listed: np.ndarray) -> torch.Tensor:
        """Host entries as a LongTensor on the combining device (a copy, not a read)."""
        return torch.from_numpy(np.ascontiguousarray(listed, dtype=np.int64)).to(self.c.device, non_blocking=True)

    # ------------------------------------------------------------------ one member

    def mass(self, member: int, entries: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The member's total probability on each entry (0 where it has no such candidate), float32
        on the combining device. Entries given as host data cost no read; ids sharing an entry
        and partial candidates add in float64, in a fixed order (what a Python sum over the
        candidates would give)."""
        listed = entries if isinstance(entries, np.ndarray) else entries.cpu().numpy()
        distribution = self.raw[member]
        home = self.union.maps[member]
        first = np.full(len(listed), -1, dtype=np.int64)
        static = listed < self.union.size
        first[static] = home.host_first_id[listed[static]]
        index = self.device_entries(first)
        zero = torch.zeros((), device=self.c.device)
        mass = torch.where(index >= 0, distribution.probs_at(index.clamp(min=0)).to(self.c.device), zero)
        partial_entries, _ = self.partial[member]
        extra = self._extra_rounds(home, listed) if home.extra_ids else []
        if not extra and not len(partial_entries) and member not in self._in_part:
            return mass
        values = mass.double()
        for positions, tokens in extra:  # each round adds one more id to each of some entries
            added = distribution.probs_at(self.device_entries(tokens)).to(self.c.device).double()
            values = values.index_add(0, self.device_entries(positions), added)
        if len(partial_entries) or member in self._in_part:
            values = values + torch.from_numpy(self._partial_values(member, listed)).to(self.c.device)
        return values.to(torch.float32)

    @staticmethod
    def _extra_rounds(home: MemberMap, listed: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(positions, ids) per round: the k-th further id of each listed entry that has one."""
        rounds: list[tuple[list[int], list[int]]] = []
        for position, entry in enumerate(listed.tolist()):
            for k, token in enumerate(home.extra_ids.get(entry, ())):
                while len(rounds) <= k:
                    rounds.append(([], []))
                rounds[k][0].append(position)
                rounds[k][1].append(token)
        return [(np.asarray(p, dtype=np.int64), np.asarray(t, dtype=np.int64)) for p, t in rounds]

    def probabilities_of(self, entry: int) -> dict[int, float]:
        """Each member's probability of one entry (what the agreement weights learn from): one read."""
        listed = np.asarray([entry], dtype=np.int64)
        members = list(self.raw)
        found = torch.cat([self.mass(member, listed) for member in members]).tolist()
        return dict(zip(members, found, strict=True))

    def own(self, member: int) -> OwnChoice:
        """The member's own greedy choice (`choice.greedy_choice`) and the entry of its text
        (`nowhere` for a control token)."""
        if member not in self._own:
            choice = self.summaries[member].choice or greedy_choice(self.c.members[member], self.raw[member])
            entry = EOS_INDEX if choice.eos else self.nowhere if choice.control else self.entry_of(choice.text)
            self._own[member] = OwnChoice(choice.pick, entry, choice.prob)
        return self._own[member]

    def pick_for(self, member: int, entry: int) -> Pick | None:
        """The member's own candidate for `entry` if that is its own choice, else None."""
        own = self.own(member)
        return own.pick if own.entry == entry else None

    # ------------------------------------------------------------------ combinations

    def full(self, weights: Sequence[float] | None = None) -> torch.Tensor:
        """sum_i w_i p_i over every entry, float32 [size] (docs/explanation/methods.md#gac); with
        one-hot `weights`, one member's whole distribution over the step's entries."""
        weights = self.weights if weights is None else weights
        for member in self.raw:
            if weights[member]:
                self._complete(member)  # (before sizing: their texts may add entries)
        total = torch.zeros(self.size, dtype=torch.float32, device=self.c.device)
        for member, distribution in self.raw.items():
            weight = weights[member]
            if not weight:
                continue
            probs = distribution.dense.to(self.c.device)  # the whole union: the whole distribution
            plan = self.union.maps[member].plan.on(self.c.device)  # ids sharing an entry add in id order
            total[: self.union.size] += plan.sum(probs.float() * weight)
            entries, masses = self.partial[member]
            if len(entries):  # distinct entries: no two adds race
                added = torch.from_numpy(weight * masses).float().to(total.device)
                total.index_add_(0, self.device_entries(entries), added)
        total[self.nowhere] = 0.0
        return total

    def candidates(self, top_k: int) -> np.ndarray:
        """Entries (host data, in text order) of every member's top-k candidates (whole tokens and
        partial texts), and of each member's own choice (whose mass adds up over ids, so it can
        lie outside its top-k)."""
        found = []
        for member in self.raw:
            found.append(self.union.maps[member].host_to_union[self._top_ids(member, top_k)])
            found.append(self._heaviest_partial(member, top_k))
            found.append(np.asarray([self.own(member).entry], dtype=np.int64))
        entries = np.concatenate(found)
        return self.in_text_order(entries[entries != self.nowhere])

    def _top_ids(self, member: int, top_k: int) -> np.ndarray:
        """The member's top-k ids (host data: from its summary where k fits, else one read)."""
        summary = self.summaries[member]
        if top_k <= len(summary.top_ids) or len(summary.top_ids) == self.raw[member].width:
            return np.asarray(summary.top_ids[:top_k], dtype=np.int64)
        return self.raw[member].top(top_k)[1].cpu().numpy()

    def _heaviest_partial(self, member: int, top_k: int) -> np.ndarray:
        """The entries of the member's `top_k` heaviest partial texts (the first among equals by
        entry). Where its groups are known only in part, the known texts decide when the k-th of
        them outweighs anything the rest could hold; otherwise the groups are fetched whole."""
        entries, masses = self.partial[member]
        if member in self._in_part:
            exact = self._partial_values(member, entries)
            if len(exact) >= top_k and np.sort(exact)[-top_k] > self._unknown_partial_bound(member) + _BOUND_SLACK:
                return self._heaviest(entries, exact, top_k)
            self._complete(member)
            entries, masses = self.partial[member]
        return self._heaviest(entries, masses, top_k)

    def _heaviest(self, entries: np.ndarray, masses: np.ndarray, top_k: int) -> np.ndarray:
        """The `top_k` entries of the largest masses; among equal masses at the cut, the smallest texts."""
        order = np.argsort(-masses, kind="stable")
        if len(order) <= top_k or masses[order[top_k - 1]] != masses[order[top_k]]:
            return entries[order[:top_k]]
        cut = masses[order[top_k - 1]]
        above = entries[masses > cut]
        tied = sorted(entries[masses == cut].tolist(), key=self.text)
        return np.concatenate([above, np.asarray(tied[: top_k - len(above)], dtype=np.int64)])

    def score(self, entries: np.ndarray, weights: Sequence[float] | None = None) -> torch.Tensor:
        """sum_i w_i p_i(entry) for the given entries only (float32, on the combining device)."""
        weights = self.weights if weights is None else weights
        total = torch.zeros(len(entries), dtype=torch.float32, device=self.c.device)
        for member in self.raw:
            if weights[member]:
                total += weights[member] * self.mass(member, entries)
        return total

    def greedy(self) -> tuple[int, bool]:
        """The exact argmax of the full distribution (of its allowed entries, under a constraint),
        and whether the shortcut decided it."""
        if self.constraint is not None:
            return self._constrained_greedy()
        decided = self.shortcut()
        if decided is not None:
            return self.pick(decided), True
        return self.pick(self.full_scored()), False

    def _constrained_greedy(self) -> tuple[int, bool]:
        """The shortcut's argument with a constraint: the best ALLOWED shortlisted candidate is
        the constrained argmax when it beats the bound on every entry outside the shortlist
        (allowed or not); otherwise the full distribution's allowed entries decide."""
        shortlist, bound = self._shortlist()
        allowed = self.allowed(shortlist)
        if allowed is not None and max(allowed.host_values()) > bound + _BOUND_SLACK:
            return self.pick(allowed), True
        return self.pick(self.full_scored()), False

    # ------------------------------------------------------------------ constraints

    def allowed(self, scored: Scored, for_argmax: bool | None = True) -> Scored | None:
        """The scored entries the constraint allows (all of them without one; None: none is).

        This step's own texts (partial candidates the union lacks; thousands after a committed
        space) are checked one by one, so where there are many: `for_argmax`, only those that
        could be the best allowed entry, best first (the others cannot be chosen by an argmax
        and are left out); False: none, kept for `choose` to check the one it draws; None: all."""
        if self.constraint is None:
            return scored
        listed = scored.host_entries()
        keep = np.flatnonzero(self._allowed_mask(listed, scored, for_argmax))
        if not len(keep):
            return None
        if len(keep) == len(listed):
            return scored
        values = None if scored.values is None else [scored.values[k] for k in keep]
        positions = self.device_entries(keep)
        return Scored(scored.entries[positions], scored.probs[positions], listed[keep], values)

    def _allowed_mask(self, listed: np.ndarray, scored: Scored, for_argmax: bool | None) -> np.ndarray:
        """bool per listed entry: union entries from the constraint's bitmask (the end: entry 0),
        never the nowhere slot, this step's own texts as `allowed` says."""
        assert self.constraint is not None
        union = self.constraint.allowed_entries()
        mask = np.zeros(len(listed), dtype=bool)
        inside = listed < self.nowhere
        mask[inside] = union[listed[inside]]
        own = np.flatnonzero(listed > self.nowhere)
        if len(own) <= _CHECK_ALL or for_argmax is None:
            for k in own:
                mask[k] = self.constraint.allows(self.text(int(listed[k])))
        elif for_argmax:
            self._allow_best_own(listed, scored, mask, own)
        else:
            mask[own] = True  # unchecked: `choose` checks what it draws
        return mask

    def _allow_best_own(self, listed: np.ndarray, scored: Scored, mask: np.ndarray, own: np.ndarray) -> None:
        """Marks the own texts that can be the argmax among allowed entries (one read: their
        values and the best allowed union entry's), checked best first until one is allowed."""
        assert self.constraint is not None
        found = np.flatnonzero(mask)
        best = scored.probs[self.device_entries(found)].max().reshape(1) if len(found) else None
        values = scored.probs[self.device_entries(own)]
        read = torch.cat([values.double()] + ([best.double()] if best is not None else [])).tolist()
        threshold = read[-1] if best is not None else -math.inf
        for k in sorted(range(len(own)), key=lambda i: -read[i]):
            if read[k] < threshold:
                break
            if self.constraint.allows(self.text(int(listed[own[k]]))):
                mask[own[k]] = True
                threshold = read[k]  # below the best allowed: cannot win; ties are kept

    def constrained(self, scored: Scored, for_argmax: bool | None = True) -> Scored:
        """`allowed`, falling back to the full distribution's allowed entries when the method's
        own set has none (e.g. UniTE's top-k or contrastive's plausible set); a step where no
        entry at all is allowed is a dead end the grammar cannot leave, said loudly."""
        found = self.allowed(scored, for_argmax)
        if found is None:
            found = self.allowed(self.full_scored(), for_argmax)
        if found is None:
            what = self.constraint.constraint.describe()  # type: ignore[union-attr]
            tail = bytes(self.constraint.committed[-40:]).decode(errors="replace")  # type: ignore[union-attr]
            raise GenerationError(f"No text any member can write is allowed by the {what} after {tail!r}.")
        return found

    def shortcut(self) -> Scored | None:
        """The candidates whose best is provably the argmax of the full distribution, scored
        exactly (None when the shortcut cannot tell: then only the full distribution can). If
        the best candidate beats the bound of `_shortlist` it IS the argmax, and every entry
        tied with it is among the candidates."""
        shortlist, bound = self._shortlist()
        return shortlist if max(shortlist.host_values(), default=0.0) > bound + _BOUND_SLACK else None

    def above(self, threshold: float) -> Scored | None:
        """Every entry whose probability in the full distribution exceeds `threshold`, scored
        exactly (None when the shortcut's bound cannot rule out one outside its candidates:
        then only the full distribution can tell)."""
        shortlist, bound = self._shortlist()
        if bound + _BOUND_SLACK >= threshold:
            return None
        keep = [k for k, value in enumerate(shortlist.host_values()) if value > threshold]
        listed = shortlist.host_entries()[keep]
        values = [shortlist.host_values()[k] for k in keep]
        probs = shortlist.probs[self.device_entries(np.asarray(keep, dtype=np.int64))]
        return Scored(self.device_entries(listed), probs, listed, values)

    def _shortlist(self) -> tuple[Scored, float]:
        """The shortcut's candidates scored exactly (read once), and the most any other entry can
        have (computed once per step).

        Only each member's top-k whole tokens and its partial texts known here (all of them, but
        for a hosted member's large groups: their most likely candidates) are scored. Any entry
        outside that set gets at most `sum_i w_i * (min(m_i * p_i[k-th], mass of i outside its
        top-k) + sum over i's groups known in part of min(m_i * the group's least sent
        probability, its mass not sent))` (m_i: the most ids of member i sharing one entry).
        """
        if self._shortlisted is None:
            bound = 0.0
            found = []
            for member in self.raw:
                summary = self.summaries[member]
                found.append(self.union.maps[member].host_to_union[np.asarray(summary.top_ids, dtype=np.int64)])
                if len(self.partial[member][0]):
                    found.append(self.partial[member][0])
                outside = max(0.0, summary.total - summary.top_sum)
                kth = summary.top_values[-1] * self.c.maps[member].ids_per_entry
                bound += self.weights[member] * (min(kth, outside) + self._unknown_partial_bound(member))
            listed = np.unique(np.concatenate(found))
            listed = listed[listed != self.nowhere]
            probs = self.score(listed)
            self._shortlisted = (Scored(self.device_entries(listed), probs, listed, probs.tolist()), bound)
        return self._shortlisted

    def unite(self, top_k: int, first_token: FirstToken) -> Scored:
        """UniTE: each member's distribution restricted to the union of all top-k candidates,
        renormalised, then averaged with the weights. A candidate a member lacks is scored
        through the member's first sub-token of that text. Nothing is read: which candidates a
        member lacks is host data."""
        listed = self.candidates(top_k)
        total = torch.zeros(len(listed), dtype=torch.float32, device=self.c.device)
        for member, distribution in self.raw.items():
            weight = self.weights[member]
            if not weight:
                continue
            mass = self.mass(member, listed)
            stand_ins = {}  # position -> the member's first sub-token of a candidate it lacks (its mass is 0)
            for position, entry in enumerate(listed.tolist()):
                if entry != EOS_INDEX and not self._has(member, entry):
                    token = first_token(member, self.text(entry))
                    if token is not None:
                        stand_ins[position] = token
            if stand_ins:
                tokens = torch.tensor(list(stand_ins.values()), device=distribution.device)
                positions = self.device_entries(np.asarray(list(stand_ins), dtype=np.int64))
                mass = mass.index_put((positions,), distribution.probs_at(tokens).to(self.c.device).float())
            norm = mass.sum()
            total += torch.where(norm > 0, weight * mass / norm, torch.zeros((), device=self.c.device))
        return Scored(self.device_entries(listed), total, listed)

    def _has(self, member: int, entry: int) -> bool:
        if entry < self.union.size and self.union.maps[member].has(entry):
            return True
        if member in self._in_part:
            return bool(self._partial_values(member, np.asarray([entry], dtype=np.int64))[0] > 0)
        return entry in self._partial_set(member)

    def sharpen_heuristic(self, scored: Scored, drafter: int, threshold: float, over_all: bool) -> Scored | None:
        """SAFE's sharpening: each entry above `threshold` that the drafter has as a candidate
        gains the mass of every entry whose text extends it (they spell the same word); the
        choice is then among those entries (None when there are none: nothing is sharpened).

        `over_all`: `scored` holds (at least) every entry of the full distribution above the
        threshold, and the mass gained is the full distribution's, which each member adds up
        over its own candidates (`Continuations.mass_extending`: a hosted member sends one
        number, not its distribution). Otherwise (UniTE's restricted distribution) it is the
        mass of the scored entries. Entries that end inside a UTF-8 character do not gain:
        byte-level vocabularies have a token for every lead byte, which would otherwise collect
        the mass of all characters it begins (e.g. all of CJK) and commit half a character."""
        listed, values = self._host(scored)
        boosted: list[tuple[int, torch.Tensor]] = []
        extending: list[tuple[int, list[tuple[int, torch.Tensor, list[float]]]]] = []
        for position in [k for k, value in enumerate(values) if value > threshold]:
            entry = int(listed[position])
            if entry == EOS_INDEX or not self._has(drafter, entry):
                continue
            prefix = self.text(entry)
            if incomplete_utf8_suffix(prefix):
                continue  # a lone lead byte would collect every character it starts, and split one
            if over_all:
                parts = [(m, *self.raw[m].extending(prefix, self.c.members[m])) for m in self.raw if self.weights[m]]
                extending.append((entry, parts))
                continue
            extends = [e != self.nowhere and self.text(e).startswith(prefix) for e in listed.tolist()]
            mask = torch.tensor(extends, device=scored.probs.device)
            boosted.append((entry, scored.probs[mask].sum()))
        if extending:  # every member's whole-token parts, for every entry, in one read
            wholes = [whole.to(self.c.device) for _, parts in extending for _, whole, _ in parts]
            read = iter(torch.cat(wholes).tolist())
            for entry, parts in extending:
                gained = 0.0
                for member, whole, partial in parts:  # exact sums (`Continuations.mass_extending`)
                    gained += self.weights[member] * math.fsum([next(read) for _ in range(len(whole))] + partial)
                boosted.append((entry, torch.tensor(gained, dtype=torch.float32)))
        if not boosted:
            return None
        chosen = np.asarray([e for e, _ in boosted], dtype=np.int64)
        return Scored(self.device_entries(chosen), torch.stack([p.to(self.c.device) for _, p in boosted]), chosen)

    def sharpen_geometric(self, top_k: int) -> Scored:
        """The geometric-mean variant: prod_i p_i^w_i over the top-k candidates, renormalised."""
        listed = self.candidates(top_k)
        log_total = torch.zeros(len(listed), dtype=torch.float32, device=self.c.device)
        for member in self.raw:
            if self.weights[member]:
                log_total += self.weights[member] * torch.log(self.mass(member, listed).clamp(min=1e-30))
        return Scored(self.device_entries(listed), torch.softmax(log_total, dim=0), listed)

    # ------------------------------------------------------------------ choosing

    def preferred(self) -> int:
        """The tie-break entry: the own choice of the heaviest member (first among equals)."""
        heaviest = max(self.raw, key=lambda m: (self.weights[m], -m))
        return self.own(heaviest).entry

    def _host(self, scored: Scored) -> tuple[np.ndarray, list[float]]:
        """A scored set's entries and values as host data, in one read at most."""
        if scored.values is None:
            if scored.listed is None:
                both = torch.stack([scored.entries.double(), scored.probs.double()]).tolist()
                scored.listed, scored.values = np.asarray(both[0], dtype=np.int64), both[1]
            else:
                scored.values = scored.probs.tolist()
        return scored.host_entries(), scored.values

    def pick(self, scored: Scored) -> int:
        """The best entry, ties resolved by the module's tie rule. A short scored set is read once
        and decided on the host; a long one (the full distribution, always in text order, so
        its first tied entry is the smallest text) is decided on the device, one read."""
        if self.constraint is not None:
            scored = self.constrained(scored)
        if scored.values is None and len(scored.entries) > _READ_WHOLE:
            return self._pick_on_device(scored)
        listed, values = self._host(scored)
        best = max(values)
        tied = [int(listed[k]) for k, value in enumerate(values) if value == best]
        if len(tied) == 1:
            return tied[0]
        preferred = self.preferred()
        return preferred if preferred in tied else min(tied, key=self.text)

    def _pick_on_device(self, scored: Scored) -> int:
        listed = scored.host_entries()  # every long set a step builds has them as host data
        preferred = self.preferred()
        best = scored.probs.max()
        is_best = scored.probs == best
        preferred_tied = is_best[self.device_entries(np.flatnonzero(listed == preferred)[:1])].any()
        first = torch.argmax(is_best.to(torch.int8))
        count, first_position, tie = torch.stack([is_best.sum(), first, preferred_tied.long()]).tolist()  # one read
        if count > 1 and tie:
            return preferred
        return int(listed[first_position])

    def choose(self, scored: Scored, settings: GenerationSettings, generator: torch.Generator | None) -> int:
        """argmax (greedy) or a seeded sample after top-p, over a scored set of entries (drawn on
        the generator's device: the combining device's, so nothing union-sized is copied)."""
        if settings.greedy or generator is None:
            return self.pick(scored)
        if self.constraint is None:
            drawn = sample(top_p_filter(scored.probs, settings.top_p), generator)
            return int(scored.listed[drawn]) if scored.listed is not None else int(scored.entries[drawn])
        return self._choose_allowed(scored, settings, generator)

    def _choose_allowed(self, scored: Scored, settings: GenerationSettings, generator: torch.Generator) -> int:
        """A sample from the allowed entries, renormalised: union entries are masked at once;
        this step's own texts, when there are many, are checked only when drawn, and one the
        grammar rejects is taken out before drawing again (rejection: the same distribution);
        after a few rejections every own text is checked at once and the last draw is from the
        allowed entries only. With top_p < 1 the nucleus is taken over what is not ruled out."""
        found = self.constrained(scored, for_argmax=False)
        listed, probs = found.host_entries(), found.probs
        assert self.constraint is not None
        for _ in range(_REJECTIONS):
            total = probs.sum()
            drawn = sample(top_p_filter(torch.where(total > 0, probs / total, probs), settings.top_p), generator)
            entry = int(listed[drawn])
            if entry <= self.nowhere or self.constraint.allows(self.text(entry)):
                return entry
            probs = probs.clone()
            probs[drawn] = 0.0
        found = self.constrained(scored, for_argmax=None)
        total = found.probs.sum()
        drawn = sample(
            top_p_filter(torch.where(total > 0, found.probs / total, found.probs), settings.top_p), generator
        )
        return int(found.host_entries()[drawn])

    def full_scored(self) -> Scored:
        """The full distribution as scored entries in text order: the union's (positions = entries),
        the nowhere slot, then this step's own entries by text."""
        total = self.full()
        fixed = np.arange(self.nowhere + 1, dtype=np.int64)
        if not self._dynamic_texts:
            return Scored(torch.arange(self.nowhere + 1, device=self.c.device), total, fixed)
        own = np.asarray(sorted(range(self.nowhere + 1, self.size), key=self.text), dtype=np.int64)
        listed = np.concatenate([fixed, own])
        entries = self.device_entries(listed)
        return Scored(entries, total[entries], listed)
