"""A hosted member's next-step distribution as it crosses the wire: its top entries, not its vocabulary.

A whole-token distribution is logits-width float32 (600 KB for Qwen's 151,936 ids) per request
and position. What the methods read from it in a greedy step is far less (`Continuations.top`,
`probs_at`, `total`, and the member's own greedy choice): the exact shortcut scores every
member's top 32 candidates and bounds the rest; the other members' candidates need this
member's probability of a few dozen ids. So the member's host sends a `WireSummary`: its
`torch.topk` for each k the driver asks for (the shortcut's 32 and a wider 256 by default:
the probabilities of other members' candidates are nearly always among them), the total, and
its greedy choice made on its side with the same rule and table. The driver's
`SummarizedContinuations` answers from that, asks the host for probabilities it lacks (one
small round trip), and fetches the whole distribution only where the full union is needed
(sampling, the shortcut's fallback). Every answer is the host's own float32 value, so the
text is the same as with the member in the driver.

Candidates from tokens that re-cover committed bytes (`PartialGroup`s) travel whole: they are
what makes the step boundary-correct, and the method may weigh any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ensemble_core.members.contract import Continuations, PartialGroup

SUMMARY_TOP_KS = (32, 256)
"""The `top(k)`s sent with every distribution until the driver asks for another k (then that one
too): the greedy shortcut's k (`methods.combine.SHORTCUT_TOP_K`) and a wider set whose
probabilities answer most lookups of other members' candidates without a round trip."""


@dataclass(frozen=True)
class WireSummary:
    """What crosses for one distribution (CPU tensors, ids as int32).

    Attributes:
        key: the host's handle of the distribution (it keeps the whole one, see `RemoteOrigin`).
        width: the logits width.
        tops: k -> (probabilities, ids) exactly as `torch.topk(dense, k)` gives them.
        total: `float(dense.sum())`.
        partial: the partial groups, whole (ids as int32).
        greedy: the member's own greedy choice (`methods.choice.Choice`).
    """

    key: int
    width: int
    tops: dict[int, tuple[torch.Tensor, torch.Tensor]]
    total: float
    partial: tuple[PartialGroup, ...]
    greedy: Any


def wire_top(found: Continuations, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's side: `found.top(k)` as it crosses (CPU, ids as int32)."""
    values, ids = found.top(k)
    return values.detach().cpu(), ids.detach().cpu().to(torch.int32)


def summarize(found: Continuations, key: int, top_ks: Sequence[int], greedy: Any) -> WireSummary:
    """The host's side: the summary of one of its member's distributions."""
    tops = {k: wire_top(found, k) for k in sorted({min(k, found.width) for k in top_ks})}  # keyed as `top` clamps
    partial = tuple(
        PartialGroup(g.skip, g.token_ids.detach().cpu().to(torch.int32), g.probs.detach().cpu(), g.route)
        for g in found.partial
    )
    return WireSummary(key, found.width, tops, found.total(), partial, greedy)


Fetch = Callable[[str, Any], Any]
"""(what, argument) -> the host's answer about one distribution: ("dense", None) -> float32
[width]; ("probs_at", ids) -> float32 [n]; ("top", k) -> (probabilities, ids)."""


class SummarizedContinuations(Continuations):
    """The driver's `Continuations` of a hosted member: answers from a `WireSummary`, asks the
    host for the rest (see the module docstring). Its tensors are on the CPU."""

    def __init__(self, summary: WireSummary, origin: Any, fetch: Fetch, learn_top: Callable[[int], None]):
        # a frozen dataclass underneath: fields are set once, here
        partial = tuple(PartialGroup(g.skip, g.token_ids.long(), g.probs, g.route) for g in summary.partial)
        object.__setattr__(self, "partial", partial)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "greedy", summary.greedy)
        object.__setattr__(self, "_summary", summary)
        object.__setattr__(self, "_fetch", fetch)
        object.__setattr__(self, "_learn_top", learn_top)
        object.__setattr__(self, "_whole", None)
        known = {}
        for values, ids in summary.tops.values():
            known.update(zip(ids.tolist(), values.tolist(), strict=True))
        order = sorted(known)
        object.__setattr__(self, "_known_ids", torch.tensor(order, dtype=torch.long))
        object.__setattr__(self, "_known_probs", torch.tensor([known[i] for i in order], dtype=torch.float32))

    @property
    def dense(self) -> torch.Tensor:  # type: ignore[override]
        """The whole distribution, fetched from the host once (only where the full union is needed)."""
        if self._whole is None:
            object.__setattr__(self, "_whole", self._fetch("dense", None))
        return self._whole

    @property
    def width(self) -> int:
        return self._summary.width

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def top(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = min(k, self.width)
        found = self._summary.tops.get(k)
        if found is None:
            self._learn_top(k)  # sent with the next distributions
            values, ids = self._fetch("top", k)
            found = (values, ids)
            self._summary.tops[k] = found
        values, ids = found
        return values, ids.to(torch.long)

    def probs_at(self, ids: torch.Tensor) -> torch.Tensor:
        if self._whole is not None:
            return self._whole[ids.cpu()]
        flat = ids.reshape(-1).cpu().to(torch.long)
        at, hit = self._lookup(flat)
        if not bool(hit.all()):
            missing = torch.unique(flat[~hit])
            fetched = self._fetch("probs_at", missing)
            merged_ids = torch.cat([self._known_ids, missing])
            order = torch.argsort(merged_ids)
            object.__setattr__(self, "_known_ids", merged_ids[order])
            object.__setattr__(self, "_known_probs", torch.cat([self._known_probs, fetched.float()])[order])
            at, hit = self._lookup(flat)
        return self._known_probs[at].reshape(ids.shape)

    def _lookup(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        known = self._known_ids
        if not len(known):
            return torch.zeros_like(flat), torch.zeros_like(flat, dtype=torch.bool)
        at = torch.searchsorted(known, flat).clamp(max=len(known) - 1)
        return at, known[at] == flat

    def total(self) -> float:
        return self._summary.total

    def on(self, device: torch.device) -> Continuations:
        return self  # answers stay on the CPU; the combining side moves the few values it reads

    def __repr__(self) -> str:
        return f"SummarizedContinuations(key={self._summary.key}, width={self.width}, partial={len(self.partial)})"
