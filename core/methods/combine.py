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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.members.contract import Continuations, MemberVocab, Pick
from ensemble_core.members.own_choice import greedy_choice
from ensemble_core.sampling import sample, top_p_filter
from ensemble_core.vocab.union import EOS_INDEX, MemberMap, UnionVocab
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

# Greedy shortcut: candidates are each member's top-k; k = 32 decides exactly in nearly every
# step (ALGORITHMS.md section 8) and costs a fraction of a millisecond.
SHORTCUT_TOP_K = 32
_BOUND_SLACK = 1e-6  # float32 sums of probabilities are not exactly 1

FirstToken = Callable[[int, bytes], "int | None"]  # (member, text) -> its first token of that text


@dataclass
class Scored:
    """Entries with their combined probability (a sub-distribution or the full one), or with
    scores to rank them by (contrastive decoding's float64 log-scores)."""

    entries: torch.Tensor  # LongTensor [n]
    probs: torch.Tensor  # float32 [n] (float64 for scores)


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

    def step(self, distributions: Mapping[int, Continuations], weights: Sequence[float] | None = None) -> Step:
        """The members' distributions for one position of one request, ready to combine (with
        that request's own weights when it has them, e.g. from `weights="auto"`)."""
        return Step(self, distributions, weights)


class Step:
    """Member distributions at one position, moved to the combining device, with every
    candidate text given an entry (a union index, or a per-step index past the union)."""

    def __init__(
        self, combiner: Combiner, distributions: Mapping[int, Continuations], weights: Sequence[float] | None = None
    ):
        self.c = combiner
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
        self._own: dict[int, OwnChoice] = {}
        self._shortlisted: tuple[Scored, float] | None = None

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

    def _partial_masses(self, member: int, distribution: Continuations) -> tuple[torch.Tensor, torch.Tensor]:
        """(sorted entries, float64 masses) of the member's partial candidates: texts of tokens
        that re-cover committed bytes, each group mapped with one tensor lookup (a group can
        hold tens of thousands of candidates: after a committed space, every space-led token)."""
        table = self.c.members[member].table
        found_entries, found_masses = [], []
        for group in distribution.partial:
            suffixes = table.suffixes(group.skip)
            ids, probs = group.known()
            ids, probs = ids.cpu().long(), probs.cpu().double()
            keep = (probs > 0) & (ids < len(suffixes.ids))
            text_ids = suffixes.ids[ids[keep]]
            probs = probs[keep]
            valid = text_ids >= 0
            text_ids, probs = text_ids[valid], probs[valid]
            entries = self.union.suffix_entries(member, group.skip, table)[text_ids]
            missing = entries < 0
            if bool(missing.any()):  # texts no member has as a whole token: this step's own entries
                unique, inverse = torch.unique(text_ids[missing], return_inverse=True)
                made = self._own_entries([suffixes.texts[t] for t in unique.tolist()])
                entries[missing] = torch.tensor(made, dtype=torch.long)[inverse]
            found_entries.append(entries)
            found_masses.append(probs)
        if not found_entries:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
        unique, inverse = torch.unique(torch.cat(found_entries), return_inverse=True)
        return unique, torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, torch.cat(found_masses))

    def pick_entry(self, member: int, pick: Pick) -> int | None:
        """The entry a member's candidate lands on (None: a control token, no text)."""
        if pick.group == -1:
            target = int(self.c.maps[member].to_union[pick.index])
            return None if target == self.nowhere else target
        group = self.raw[member].partial[pick.group]
        spelled = self.c.members[member].table.token_bytes[group.token(pick.index)] or b""
        return self.entry_of(spelled[group.skip :])

    def _partial_values(self, member: int, listed: torch.Tensor) -> torch.Tensor:
        """float64 [n]: the member's partial mass on each entry of `listed` (CPU LongTensor)."""
        if member in self._in_part:
            return self._asked_partial_values(member, listed)
        values = torch.zeros(len(listed), dtype=torch.float64)
        partial_entries, partial_masses = self.partial[member]
        if len(partial_entries):
            at = torch.searchsorted(partial_entries, listed).clamp(max=len(partial_entries) - 1)
            hit = partial_entries[at] == listed
            values[hit] = partial_masses[at[hit]]
        return values

    def _asked_partial_values(self, member: int, listed: torch.Tensor) -> torch.Tensor:
        """`_partial_values` where some group is known only in part: each group's probability of
        each listed text, added group by group in group order (the sums the whole groups give),
        the group asked only for the tokens it did not send."""
        table = self.c.members[member].table
        texts = [b"" if e in (EOS_INDEX, self.nowhere) else self.text(e) for e in listed.tolist()]
        total = torch.zeros(len(texts), dtype=torch.float64)
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
            total += torch.tensor(sums, dtype=torch.float64)
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

    def in_text_order(self, entries: torch.Tensor) -> torch.Tensor:
        """Sorted entries (union entries are in text order) with this step's own ones merged in by text."""
        if not bool((entries > self.nowhere).any()):
            return entries
        return torch.tensor(sorted(entries.tolist(), key=self.text), dtype=torch.long, device=entries.device)

    def _partial_set(self, member: int) -> set[int]:
        if member not in self._partial_sets:
            self._partial_sets[member] = set(self.partial[member][0].tolist())
        return self._partial_sets[member]

    # ------------------------------------------------------------------ one member

    def mass(self, member: int, entries: torch.Tensor) -> torch.Tensor:
        """The member's total probability on each entry (0 where it has no such candidate)."""
        distribution = self.raw[member]
        member_map = self.c.maps[member]
        static = entries < self.union.size
        first = torch.full_like(entries, -1)
        first[static] = member_map.first_id[entries[static]]
        found = first >= 0
        zero = torch.zeros((), device=entries.device)
        mass = torch.where(found, distribution.probs_at(first.clamp(min=0)).to(entries.device), zero)
        partial_entries, _ = self.partial[member]
        if not member_map.extra_ids and not len(partial_entries) and member not in self._in_part:
            return mass
        values = mass.double().cpu()  # float64, as a Python sum over the candidates would add
        listed = entries.cpu()
        if member_map.extra_ids:
            shared = torch.nonzero(torch.isin(listed, member_map.shared_entries)).flatten().tolist()
            extra = [(position, token) for position in shared for token in member_map.extra_ids[int(listed[position])]]
            if extra:
                tokens = torch.tensor([token for _, token in extra], device=distribution.device)
                for (position, _), prob in zip(extra, distribution.probs_at(tokens).tolist(), strict=True):
                    values[position] += prob
        if len(partial_entries) or member in self._in_part:
            values += self._partial_values(member, listed)
        return values.to(torch.float32).to(entries.device)

    def probabilities_of(self, entry: int) -> dict[int, float]:
        """Each member's probability of one entry (what the agreement weights learn from)."""
        entries = torch.tensor([entry], device=self.c.device)
        return {member: float(self.mass(member, entries)[0]) for member in self.raw}

    def own(self, member: int) -> OwnChoice:
        """The member's own greedy choice (`choice.greedy_choice`) and the entry of its text
        (`nowhere` for a control token)."""
        if member not in self._own:
            choice = greedy_choice(self.c.members[member], self.raw[member])
            entry = EOS_INDEX if choice.eos else self.nowhere if choice.control else self.entry_of(choice.text)
            self._own[member] = OwnChoice(choice.pick, entry, choice.prob)
        return self._own[member]

    def pick_for(self, member: int, entry: int) -> Pick | None:
        """The member's own candidate for `entry` if that is its own choice, else None."""
        own = self.own(member)
        return own.pick if own.entry == entry else None

    # ------------------------------------------------------------------ combinations

    def full(self, weights: Sequence[float] | None = None) -> torch.Tensor:
        """sum_i w_i p_i over every entry, float32 [size] (ALGORITHMS.md section 1); with
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
            total.index_add_(0, self.c.maps[member].to_union[: probs.shape[0]], probs * weight)
            entries, masses = self.partial[member]
            if len(entries):
                total.index_add_(0, entries.to(total.device), (weight * masses).to(torch.float32).to(total.device))
        total[self.nowhere] = 0.0
        return total

    def candidates(self, top_k: int) -> torch.Tensor:
        """Sorted entries of every member's top-k candidates (whole tokens and partial texts), and
        of each member's own choice (whose mass adds up over ids, so it can lie outside its top-k)."""
        found = []
        for member, distribution in self.raw.items():
            _, ids = distribution.top(top_k)
            found.append(self.c.maps[member].to_union[ids.to(self.c.device)])
            heaviest = self._heaviest_partial(member, top_k)
            own = torch.tensor([self.own(member).entry], dtype=torch.long)
            found.append(torch.cat([heaviest, own]).to(self.c.device))
        entries = torch.unique(torch.cat(found))
        return self.in_text_order(entries[entries != self.nowhere])

    def _heaviest_partial(self, member: int, top_k: int) -> torch.Tensor:
        """The entries of the member's `top_k` heaviest partial texts (the first among equals by
        entry). Where its groups are known only in part, the known texts decide when the k-th of
        them outweighs anything the rest could hold; otherwise the groups are fetched whole."""
        entries, masses = self.partial[member]
        if member in self._in_part:
            exact = self._partial_values(member, entries)
            if (
                len(exact) >= top_k
                and float(torch.topk(exact, top_k).values[-1]) > self._unknown_partial_bound(member) + _BOUND_SLACK
            ):
                return self._heaviest(entries, exact, top_k)
            self._complete(member)
            entries, masses = self.partial[member]
        return self._heaviest(entries, masses, top_k)

    def _heaviest(self, entries: torch.Tensor, masses: torch.Tensor, top_k: int) -> torch.Tensor:
        """The `top_k` entries of the largest masses; among equal masses at the cut, the smallest texts."""
        order = torch.sort(masses, descending=True, stable=True).indices
        if len(order) <= top_k or float(masses[order[top_k - 1]]) != float(masses[order[top_k]]):
            return entries[order[:top_k]]
        cut = masses[order[top_k - 1]]
        above = entries[masses > cut]
        tied = sorted(entries[masses == cut].tolist(), key=self.text)
        return torch.cat([above, torch.tensor(tied[: top_k - len(above)], dtype=torch.long)])

    def score(self, entries: torch.Tensor, weights: Sequence[float] | None = None) -> torch.Tensor:
        """sum_i w_i p_i(entry) for the given entries only."""
        weights = self.weights if weights is None else weights
        total = torch.zeros(len(entries), dtype=torch.float32, device=self.c.device)
        for member in self.raw:
            if weights[member]:
                total += weights[member] * self.mass(member, entries)
        return total

    def greedy(self) -> tuple[int, bool]:
        """The exact argmax of the full distribution, and whether the shortcut decided it."""
        decided = self.shortcut()
        if decided is not None:
            return self.pick(decided), True
        return self.pick(self.full_scored()), False

    def shortcut(self) -> Scored | None:
        """The candidates whose best is provably the argmax of the full distribution, scored
        exactly (None when the shortcut cannot tell: then only the full distribution can). If
        the best candidate beats the bound of `_shortlist` it IS the argmax, and every entry
        tied with it is among the candidates."""
        shortlist, bound = self._shortlist()
        return shortlist if float(shortlist.probs.max()) > bound + _BOUND_SLACK else None

    def above(self, threshold: float) -> Scored | None:
        """Every entry whose probability in the full distribution exceeds `threshold`, scored
        exactly (None when the shortcut's bound cannot rule out one outside its candidates:
        then only the full distribution can tell)."""
        shortlist, bound = self._shortlist()
        if bound + _BOUND_SLACK >= threshold:
            return None
        keep = shortlist.probs > threshold
        return Scored(shortlist.entries[keep], shortlist.probs[keep])

    def _shortlist(self) -> tuple[Scored, float]:
        """The shortcut's candidates scored exactly, and the most any other entry can have
        (computed once per step).

        Only each member's top-k whole tokens and its partial texts known here (all of them, but
        for a hosted member's large groups: their most likely candidates) are scored. Any entry
        outside that set gets at most `sum_i w_i * (min(m_i * p_i[k-th], mass of i outside its
        top-k) + sum over i's groups known in part of min(m_i * the group's least sent
        probability, its mass not sent))` (m_i: the most ids of member i sharing one entry).
        """
        if self._shortlisted is None:
            bound = 0.0
            found = []
            for member, distribution in self.raw.items():
                values, ids = distribution.top(SHORTCUT_TOP_K)
                found.append(self.c.maps[member].to_union[ids.to(self.c.device)])
                if len(self.partial[member][0]):
                    found.append(self.partial[member][0].to(self.c.device))
                outside = max(0.0, distribution.total() - float(values.sum()))
                kth = float(values[-1]) * self.c.maps[member].ids_per_entry
                bound += self.weights[member] * (min(kth, outside) + self._unknown_partial_bound(member))
            entries = torch.unique(torch.cat(found))
            entries = entries[entries != self.nowhere]
            self._shortlisted = (Scored(entries, self.score(entries)), bound)
        return self._shortlisted

    def unite(self, top_k: int, first_token: FirstToken) -> Scored:
        """UniTE: each member's distribution restricted to the union of all top-k candidates,
        renormalised, then averaged with the weights. A candidate a member lacks is scored
        through the member's first sub-token of that text."""
        entries = self.candidates(top_k)
        total = torch.zeros(len(entries), dtype=torch.float32, device=self.c.device)
        for member, distribution in self.raw.items():
            weight = self.weights[member]
            if not weight:
                continue
            values = self.mass(member, entries).tolist()
            stand_ins = {}  # position -> the member's first sub-token of a candidate it lacks
            for position, entry in enumerate(entries.tolist()):
                if entry != EOS_INDEX and values[position] == 0.0 and not self._has(member, entry):
                    token = first_token(member, self.text(entry))
                    if token is not None:
                        stand_ins[position] = token
            if stand_ins:
                tokens = torch.tensor(list(stand_ins.values()), device=distribution.device)
                for position, prob in zip(stand_ins, distribution.probs_at(tokens).tolist(), strict=True):
                    values[position] = prob
            mass = torch.tensor(values, dtype=torch.float32, device=self.c.device)
            norm = float(mass.sum())
            if norm > 0:
                total += weight * mass / norm
        return Scored(entries, total)

    def _has(self, member: int, entry: int) -> bool:
        if entry < self.union.size and self.c.maps[member].has(entry):
            return True
        if member in self._in_part:
            return bool(self._partial_values(member, torch.tensor([entry]))[0] > 0)
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
        boosted: list[tuple[int, torch.Tensor]] = []
        for position in torch.nonzero(scored.probs > threshold).flatten().tolist():
            entry = int(scored.entries[position])
            if entry == EOS_INDEX or not self._has(drafter, entry):
                continue
            prefix = self.text(entry)
            if incomplete_utf8_suffix(prefix):
                continue  # a lone lead byte would collect every character it starts, and split one
            if over_all:
                gained = sum(
                    self.weights[m] * self.raw[m].mass_extending(prefix, self.c.members[m])
                    for m in self.raw
                    if self.weights[m]
                )
                boosted.append((entry, torch.tensor(gained, dtype=torch.float32)))
                continue
            extends = [e != self.nowhere and self.text(e).startswith(prefix) for e in scored.entries.tolist()]
            mask = torch.tensor(extends, device=scored.probs.device)
            boosted.append((entry, scored.probs[mask].sum()))
        if not boosted:
            return None
        return Scored(
            torch.tensor([e for e, _ in boosted], device=self.c.device),
            torch.stack([p.to(self.c.device) for _, p in boosted]),
        )

    def sharpen_geometric(self, top_k: int) -> Scored:
        """The geometric-mean variant: prod_i p_i^w_i over the top-k candidates, renormalised."""
        entries = self.candidates(top_k)
        log_total = torch.zeros(len(entries), dtype=torch.float32, device=self.c.device)
        for member in self.raw:
            if self.weights[member]:
                log_total += self.weights[member] * torch.log(self.mass(member, entries).clamp(min=1e-30))
        return Scored(entries, torch.softmax(log_total, dim=0))

    # ------------------------------------------------------------------ choosing

    def preferred(self) -> int:
        """The tie-break entry: the own choice of the heaviest member (first among equals)."""
        heaviest = max(self.raw, key=lambda m: (self.weights[m], -m))
        return self.own(heaviest).entry

    def pick(self, scored: Scored) -> int:
        """The best entry, ties resolved by the module's tie rule."""
        best = scored.probs.max()
        tied = scored.entries[scored.probs == best]
        if len(tied) == 1:
            return int(tied[0])
        preferred = self.preferred()
        return preferred if bool((tied == preferred).any()) else min(tied.tolist(), key=self.text)

    def choose(self, scored: Scored, settings: GenerationSettings, generator: torch.Generator | None) -> int:
        """argmax (greedy) or a seeded sample after top-p, over a scored set of entries."""
        if settings.greedy or generator is None:
            return self.pick(scored)
        probs = top_p_filter(scored.probs, settings.top_p)
        return int(scored.entries[sample(probs, generator)])

    def full_scored(self) -> Scored:
        """The full distribution as scored entries in text order: the union's (positions = entries),
        the nowhere slot, then this step's own entries by text."""
        total = self.full()
        fixed = torch.arange(self.nowhere + 1, device=self.c.device)
        if not self._dynamic_texts:
            return Scored(fixed, total)
        own = sorted(range(self.nowhere + 1, self.size), key=self.text)
        entries = torch.cat([fixed, torch.tensor(own, dtype=torch.long, device=self.c.device)])
        return Scored(entries, total[entries])
