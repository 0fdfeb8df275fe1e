"""Adding the probabilities of several ids into one slot, in a fixed order, on any device.

A text's probability is what every id spelling it adds up to (ids with the same bytes: Gemma's
`\\n` is both an added token and a byte token), and the union vocabulary adds members' ids into
its entries the same way. `index_add_` does that in one kernel, but on CUDA it adds with float
atomics in an order that changes from run to run: two runs of one greedy generation could then
break a tie differently, and one model twice would no longer be that model alone.

A `SegmentPlan` adds in a fixed order instead: each slot takes its first id's value (a gather),
then its second id's in one round, its third in the next, and so on; a slot receives at most one
value per round, so no two adds ever race. On the CPU the sums are exactly those `index_add_`
makes going through the ids in order (0 + a + b + ... with the same roundings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SegmentPlan:
    """How ids add into slots.

    Attributes:
        size: the number of slots.
        first: LongTensor [size]: each slot's lowest id, or -1 for a slot no id adds to.
        rounds: per round k >= 1, (slots, ids): the slots with a (k+1)-th id, and that id.
    """

    size: int
    first: torch.Tensor
    rounds: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    _placed: dict[torch.device, SegmentPlan] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, slots: Sequence[int], size: int) -> SegmentPlan:
        """The plan for ids 0..len(slots)-1, id i adding into slot `slots[i]` (none where -1)."""
        first = [-1] * size
        later: list[list[tuple[int, int]]] = []
        seen = [0] * size
        for token, slot in enumerate(slots):
            if slot < 0:
                continue
            count = seen[slot]
            seen[slot] = count + 1
            if count == 0:
                first[slot] = token
                continue
            while len(later) < count:
                later.append([])
            later[count - 1].append((slot, token))
        rounds = tuple(
            (
                torch.tensor([s for s, _ in pairs], dtype=torch.long),
                torch.tensor([t for _, t in pairs], dtype=torch.long),
            )
            for pairs in later
        )
        return cls(size, torch.tensor(first, dtype=torch.long), rounds)

    def on(self, device: torch.device) -> SegmentPlan:
        """This plan with its index tensors on `device` (moved once, then reused)."""
        if self.first.device == device:
            return self
        if device not in self._placed:
            moved = tuple((slots.to(device), ids.to(device)) for slots, ids in self.rounds)
            self._placed[device] = SegmentPlan(self.size, self.first.to(device), moved)
        return self._placed[device]

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """float32 [size]: per slot, the sum of its ids' values (0 where none), on `values`' device
        (the plan must be there: `on`)."""
        values = values.float()
        present = self.first >= 0
        out = torch.where(present, values[self.first.clamp(min=0)], torch.zeros((), device=values.device))
        for slots, ids in self.rounds:
            out.index_add_(0, slots, values[ids])  # distinct slots: no two adds to one slot race
        return out


def _longs(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long)
