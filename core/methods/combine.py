"""Combining members' next-token distributions in the union vocabulary.

Shared by every token-level method (GaC, UniTE, SAFE): the full weighted union distribution,
the EXACT greedy shortcut over top-k candidates, UniTE's top-k restricted distribution, the
tie rule, SAFE's sharpening, and the choice (argmax or seeded sample).

Tie rule (the same on every path, so a method that skips work picks what the full
computation would): among union entries with exactly the highest score, the argmax entry
of the member with the largest weight wins (the first such member); otherwise the lowest
union index. With one member at weight 1, or the same model twice, this reproduces that
member's own greedy choice even when its top two logits are equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.members.text_sync import MemberSession, incomplete_utf8_suffix
from ensemble_core.sampling import sample, top_p_filter
from ensemble_core.union import EOS_INDEX, UnionVocab

FirstToken = Callable[[int, bytes], "int | None"]  # (member, text) -> its first token of that text


def first_tokens_of(sessions: Mapping[int, MemberSession]) -> FirstToken:
    """UniTE's lookup for a candidate a member lacks: the member's first token of that text."""

    def first_token(member: int, text: bytes) -> int | None:
        ids = sessions[member].encoder.encode(text)
        return ids[0] if ids else None

    return first_token


# Greedy shortcut: candidates are each member's top-k; k = 32 decides exactly in nearly
# every step (ALGORITHMS.md section 8) and costs a fraction of a millisecond.
SHORTCUT_TOP_K = 32
_BOUND_SLACK = 1e-6  # float32 sums of probabilities are not exactly 1


@dataclass
class Scored:
    """Union entries with their combined probability (a sub-distribution or the full one)."""

    entries: torch.Tensor  # LongTensor [n]
    probs: torch.Tensor  # float32 [n]


class Combiner:
    """Weighted combinations of member distributions over one union.

    Args:
        union: the members' union vocabulary.
        weights: one non-negative weight per member (in union member order), summing to 1.
    """

    def __init__(self, union: UnionVocab, weights: Sequence[float]):
        self.union = union
        self.weights = list(weights)
        self._first_tokens: list[dict[bytes, int | None]] = [{} for _ in union.maps]

    # -------------------------------------------------------------- per member

    @staticmethod
    def member_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """float32 softmax(logits / temperature) of a 1-D logits row."""
        scaled = logits.float() if temperature in (0.0, 1.0) else logits.float() / temperature
        return torch.softmax(scaled, dim=-1)

    def mass(self, member: int, probs: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
        """The member's total probability on each union entry (0 where it has no such token)."""
        member_map = self.union.maps[member]
        first = member_map.first_id[entries]
        found = first >= 0
        mass = torch.where(found, probs[first.clamp(min=0)].float(), torch.zeros(()))
        if member_map.extra_ids:
            for position, entry in enumerate(entries.tolist()):
                for token in member_map.extra_ids.get(entry, ()):
                    mass[position] += probs[token].float()
        return mass

    def top_entry(self, member: int, probs: torch.Tensor) -> tuple[int, int]:
        """(member's argmax id, its union entry)."""
        token = int(torch.argmax(probs))
        return token, int(self.union.maps[member].to_union[token])

    # -------------------------------------------------------------- combinations

    def full(self, probs: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """sum_i w_i p_i over the whole union, float32 [union size] (ALGORITHMS.md section 1)."""
        total = torch.zeros(self.union.size + 1, dtype=torch.float32)
        for member, member_probs in probs.items():
            weight = self.weights[member]
            if weight:
                source = member_probs.float() * weight  # any input dtype accumulates in float32
                total.index_add_(0, self.union.maps[member].to_union[: member_probs.shape[0]], source)
        return total[: self.union.size]

    def candidates(self, probs: Mapping[int, torch.Tensor], top_k: int) -> torch.Tensor:
        """Sorted union entries of every member's top-k tokens."""
        found = []
        for member, member_probs in probs.items():
            ids = torch.topk(member_probs, min(top_k, member_probs.shape[0])).indices
            found.append(self.union.maps[member].to_union[ids])
        entries = torch.unique(torch.cat(found))
        return entries[entries < self.union.size]

    def score(self, probs: Mapping[int, torch.Tensor], entries: torch.Tensor) -> torch.Tensor:
        """sum_i w_i p_i(entry) for the given entries only."""
        total = torch.zeros(len(entries), dtype=torch.float32)
        for member, member_probs in probs.items():
            if self.weights[member]:
                total += self.mass(member, member_probs * self.weights[member], entries)
        return total

    def greedy(self, probs: Mapping[int, torch.Tensor]) -> tuple[int, bool]:
        """The exact argmax of the full union distribution, and whether the shortcut decided it.

        Only the union of each member's top-k is scored. Any entry outside it gets at most
        `sum_i w_i * min(m_i * p_i[k-th], mass of i outside its top-k)` (m_i: the most ids of
        member i sharing one entry); if the best candidate beats that bound it IS the argmax,
        else the full union decides.
        """
        bound = 0.0
        found = []
        for member, member_probs in probs.items():
            top = torch.topk(member_probs, min(SHORTCUT_TOP_K, member_probs.shape[0]))
            found.append(self.union.maps[member].to_union[top.indices])
            outside = max(0.0, 1.0 - float(top.values.sum()))
            kth = float(top.values[-1]) * self.union.maps[member].ids_per_entry
            bound += self.weights[member] * min(kth, outside)
        entries = torch.unique(torch.cat(found))
        entries = entries[entries < self.union.size]
        scores = self.score(probs, entries)
        if float(scores.max()) > bound + _BOUND_SLACK:
            return self.pick(Scored(entries, scores), self.preferred(probs)), True
        full = self.full(probs)
        return self.pick(Scored(torch.arange(self.union.size), full), self.preferred(probs)), False

    def unite(self, probs: Mapping[int, torch.Tensor], top_k: int, first_token: FirstToken) -> Scored:
        """UniTE: each member's distribution restricted to the union of all top-k, renormalised,
        then averaged with the weights. A candidate a member lacks is scored through the
        member's first sub-token of that text."""
        entries = self.candidates(probs, top_k)
        total = torch.zeros(len(entries), dtype=torch.float32)
        for member, member_probs in probs.items():
            if not self.weights[member]:
                continue
            mass = self.mass(member, member_probs, entries)
            for position, entry in enumerate(entries.tolist()):
                if entry != EOS_INDEX and not self.union.maps[member].has(entry):
                    token = self._first_token(member, entry, first_token)
                    mass[position] = member_probs[token] if token is not None else 0.0
            norm = float(mass.sum())
            if norm > 0:
                total += self.weights[member] * mass / norm
        return Scored(entries, total)

    def _first_token(self, member: int, entry: int, first_token: FirstToken) -> int | None:
        cache = self._first_tokens[member]
        text = self.union.entries[entry]
        if text not in cache:
            cache[text] = first_token(member, text)
        return cache[text]

    def sharpen_heuristic(self, scored: Scored, drafter: int, threshold: float) -> Scored:
        """SAFE's sharpening: each entry above `threshold` that the drafter has as a token gains
        the mass of every scored entry whose text extends it (they spell the same word); the
        choice is then among those entries. Unchanged when there are none. Entries that end
        inside a UTF-8 character do not gain: byte-level vocabularies have a token for every
        lead byte, which would otherwise collect the mass of all characters it begins (e.g.
        all of CJK) and commit half a character."""
        whole_union = len(scored.entries) == self.union.size
        boosted: list[tuple[int, torch.Tensor]] = []
        for position in torch.nonzero(scored.probs > threshold).flatten().tolist():
            entry = int(scored.entries[position])
            if entry == EOS_INDEX or not self.union.maps[drafter].has(entry):
                continue
            if incomplete_utf8_suffix(self.union.entries[entry]):
                continue  # a lone lead byte would collect every character it starts, and split one
            if whole_union:  # sorted entries: the extensions are one contiguous range
                lo, hi = self.union.extension_range(entry)
                boosted.append((entry, scored.probs[lo:hi].sum()))
                continue
            prefix = self.union.entries[entry]
            extends = [self.union.entries[e].startswith(prefix) for e in scored.entries.tolist()]
            boosted.append((entry, scored.probs[torch.tensor(extends)].sum()))
        if not boosted:
            return scored
        return Scored(torch.tensor([e for e, _ in boosted]), torch.stack([p for _, p in boosted]))

    def sharpen_geometric(self, probs: Mapping[int, torch.Tensor], top_k: int) -> Scored:
        """The geometric-mean variant: prod_i p_i^w_i over the top-k candidates, renormalised."""
        entries = self.candidates(probs, top_k)
        log_total = torch.zeros(len(entries), dtype=torch.float32)
        for member, member_probs in probs.items():
            if self.weights[member]:
                log_total += self.weights[member] * torch.log(self.mass(member, member_probs, entries).clamp(min=1e-30))
        return Scored(entries, torch.softmax(log_total, dim=0))

    # -------------------------------------------------------------- choosing

    def preferred(self, probs: Mapping[int, torch.Tensor]) -> int:
        """The tie-break entry: the argmax entry of the heaviest member (first among equals)."""
        heaviest = max(probs, key=lambda m: (self.weights[m], -m))
        return self.top_entry(heaviest, probs[heaviest])[1]

    @staticmethod
    def pick(scored: Scored, preferred: int) -> int:
        """The best entry, ties resolved by the module's tie rule."""
        best = scored.probs.max()
        tied = scored.entries[scored.probs == best]
        if len(tied) == 1:
            return int(tied[0])
        return preferred if bool((tied == preferred).any()) else int(tied.min())

    def choose(
        self, scored: Scored, settings: GenerationSettings, generator: torch.Generator | None, preferred: int
    ) -> int:
        """argmax (greedy) or a seeded sample after top-p, over a scored set of entries."""
        if settings.greedy or generator is None:
            return self.pick(scored, preferred)
        probs = scored.probs / scored.probs.sum()
        return int(scored.entries[sample(top_p_filter(probs, settings.top_p), generator)])
