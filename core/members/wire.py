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

Candidates from tokens that re-cover committed bytes (`PartialGroup`s) are summarised the same
way: a group of up to `PARTIAL_SENT` candidates travels whole; a larger one (after a committed
space: every space-led token, tens of thousands) sends its `PARTIAL_SENT` most likely candidates
and what bounds the rest (the least probability sent, the mass not sent). The driver's
`SummarizedPartialGroup` asks for the probabilities of other candidates by token id, and for the
whole group only where the full union is needed; the shortcut (`methods.combine.Step.shortcut`)
adds the bound to its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ensemble_core.members.contract import Continuations, PartialGroup

PARTIAL_SENT = 256
"""A partial group of at most this many candidates crosses whole; a larger one sends this many."""

SUMMARY_TOP_KS = (32, 256)
"""The `top(k)`s sent with every distribution until the driver asks for another k (then that one
too): the greedy shortcut's k (`methods.combine.SHORTCUT_TOP_K`) and a wider set whose
probabilities answer most lookups of other members' candidates without a round trip."""


@dataclass(frozen=True)
class PartialSummary:
    """What crosses for one large partial group: its most likely candidates and a bound on the rest.

    Attributes:
        skip / route: as the group's (`PartialGroup`).
        count: how many candidates the group has.
        positions: int32 [t]: where the sent candidates sit in the group (what `Pick`s name).
        token_ids: int32 [t]; probs: float32 [t]: the sent candidates, most likely first.
        rest: the probability of the candidates not sent, together (float64 sum).
    """

    skip: int
    route: int
    count: int
    positions: torch.Tensor
    token_ids: torch.Tensor
    probs: torch.Tensor
    rest: float


@dataclass(frozen=True)
class WireSummary:
    """What crosses for one distribution (CPU tensors, ids as int32).

    Attributes:
        key: the host's handle of the distribution (it keeps the whole one, see `RemoteOrigin`).
        width: the logits width.
        tops: k -> (probabilities, ids) exactly as `torch.topk(dense, k)` gives them.
        total: `float(dense.sum())`.
        partial: the partial groups: small ones whole (ids as int32), large ones summarised.
        greedy: the member's own greedy choice (`members.own_choice.Choice`).
    """

    key: int
    width: int
    tops: dict[int, tuple[torch.Tensor, torch.Tensor]]
    total: float
    partial: tuple[PartialGroup | PartialSummary, ...]
    greedy: Any


def wire_top(found: Continuations, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's side: `found.top(k)` as it crosses (CPU, ids as int32)."""
    values, ids = found.top(k)
    return values.detach().cpu(), ids.detach().cpu().to(torch.int32)


def wire_group(group: PartialGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's side: a whole partial group as it crosses (CPU, ids as int32)."""
    return group.token_ids.detach().cpu().to(torch.int32), group.probs.detach().cpu().float()


def wire_group_probs(group: PartialGroup, token_ids: torch.Tensor) -> torch.Tensor:
    """The host's side: float32 [n], each token's probability as a candidate of the group (0 where
    it is not one)."""
    return torch.tensor(group.probs_of(token_ids.tolist()), dtype=torch.float32)


def summarize_group(group: PartialGroup) -> PartialGroup | PartialSummary:
    """The host's side: a partial group as it crosses (see the module docstring)."""
    ids, probs = wire_group(group)
    if len(ids) <= PARTIAL_SENT:
        return PartialGroup(group.skip, ids, probs, group.route)
    sent = torch.topk(probs, PARTIAL_SENT)
    rest = torch.ones(len(probs), dtype=torch.bool)
    rest[sent.indices] = False
    return PartialSummary(
        group.skip,
        group.route,
        len(ids),
        sent.indices.to(torch.int32),
        ids[sent.indices],
        sent.values,
        float(probs[rest].double().sum()),
    )


def summarize(found: Continuations, key: int, top_ks: Sequence[int], greedy: Any) -> WireSummary:
    """The host's side: the summary of one of its member's distributions."""
    tops = {k: wire_top(found, k) for k in sorted({min(k, found.width) for k in top_ks})}  # keyed as `top` clamps
    partial = tuple(summarize_group(g) for g in found.partial)
    return WireSummary(key, found.width, tops, found.total(), partial, greedy)


Fetch = Callable[[str, Any], Any]
"""(what, argument) -> the host's answer about one distribution: ("dense", None) -> float32
[width]; ("probs_at", ids) -> float32 [n]; ("top", k) -> (probabilities, ids); ("group", g) ->
partial group g whole as (int32 ids, float32 probabilities); ("group_probs", (g, ids)) -> float32
[n], each token's probability in group g (0 where it is not a candidate); ("mass_extending",
prefix) -> float, `Continuations.mass_extending` on the host."""


class SummarizedPartialGroup(PartialGroup):
    """The driver's view of a large partial group of a hosted member: answers from its
    `PartialSummary`, asks the host for other tokens' probabilities, and fetches the whole group
    (then it is complete) only where every candidate is read. Its tensors are on the CPU."""

    def __init__(self, summary: PartialSummary, group: int, fetch: Fetch):
        # a frozen dataclass underneath: fields are set once, here
        object.__setattr__(self, "skip", summary.skip)
        object.__setattr__(self, "route", summary.route)
        object.__setattr__(self, "_summary", summary)
        object.__setattr__(self, "_group", group)
        object.__setattr__(self, "_fetch", fetch)
        object.__setattr__(self, "_whole", None)
        known = dict(zip(summary.token_ids.tolist(), summary.probs.tolist(), strict=True))
        object.__setattr__(self, "_probs_by_id", known)  # grows with every answer from the host
        object.__setattr__(self, "_sent_at", dict(zip(summary.positions.tolist(), range(len(known)), strict=True)))

    def _fetched(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._whole is None:
            ids, probs = self._fetch("group", self._group)
            object.__setattr__(self, "_whole", (ids.long(), probs.float()))
        return self._whole

    @property
    def token_ids(self) -> torch.Tensor:  # type: ignore[override]
        """Every candidate's id (the whole group, fetched from the host once)."""
        return self._fetched()[0]

    @property
    def probs(self) -> torch.Tensor:  # type: ignore[override]
        """Every candidate's probability (the whole group, fetched from the host once)."""
        return self._fetched()[1]

    @property
    def complete(self) -> bool:
        return self._whole is not None

    def known(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._whole is not None:
            return self._whole
        return self._summary.token_ids.long(), self._summary.probs

    @property
    def unknown_bound(self) -> float:
        return 0.0 if self._whole is not None else min(float(self._summary.probs[-1]), self._summary.rest)

    @property
    def unknown_mass(self) -> float:
        return 0.0 if self._whole is not None else self._summary.rest

    def token(self, index: int) -> int:
        sent = self._sent_at.get(index)
        if self._whole is None and sent is not None:
            return int(self._summary.token_ids[sent])
        return int(self.token_ids[index])

    def prob(self, index: int) -> float:
        sent = self._sent_at.get(index)
        if self._whole is None and sent is not None:
            return float(self._summary.probs[sent])
        return float(self.probs[index])

    def probs_of(self, token_ids: Sequence[int]) -> list[float]:
        if self._whole is not None:
            return super().probs_of(token_ids)
        known = self._probs_by_id
        missing = sorted({t for t in token_ids if t not in known})
        if missing:
            asked = self._fetch("group_probs", (self._group, torch.tensor(missing, dtype=torch.int32)))
            known.update(zip(missing, asked.tolist(), strict=True))
        return [known[t] for t in token_ids]

    def __repr__(self) -> str:
        summary = self._summary
        return f"SummarizedPartialGroup(skip={self.skip}, count={summary.count}, sent={len(summary.token_ids)})"


class SummarizedContinuations(Continuations):
    """The driver's `Continuations` of a hosted member: answers from a `WireSummary`, asks the
    host for the rest (see the module docstring). Its tensors are on the CPU."""

    def __init__(self, summary: WireSummary, origin: Any, fetch: Fetch, learn_top: Callable[[int], None]):
        # a frozen dataclass underneath: fields are set once, here
        partial = tuple(
            SummarizedPartialGroup(g, index, fetch)
            if isinstance(g, PartialSummary)
            else PartialGroup(g.skip, g.token_ids.long(), g.probs, g.route)
            for index, g in enumerate(summary.partial)
        )
        object.__setattr__(self, "partial", partial)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "greedy", summary.greedy)
        object.__setattr__(self, "_summary", summary)
        object.__setattr__(self, "_fetch", fetch)
        object.__setattr__(self, "_learn_top", learn_top)
        object.__setattr__(self, "_whole", None)
        object.__setattr__(self, "_extending", {})  # prefix -> the host's `mass_extending`
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

    def mass_extending(self, prefix: bytes, vocab: Any) -> float:
        """Asked of the host: one float back, however many candidates extend the prefix."""
        answers = self._extending
        if prefix not in answers:
            answers[prefix] = self._fetch("mass_extending", prefix)
        return answers[prefix]

    def extending(self, prefix: bytes, vocab: Any) -> tuple[torch.Tensor, list[float]]:
        """The host's exact sum, as the one part there is to add."""
        return torch.zeros(0), [self.mass_extending(prefix, vocab)]

    def on(self, device: torch.device) -> Continuations:
        return self  # answers stay on the CPU; the combining side moves the few values it reads

    def __repr__(self) -> str:
        return f"SummarizedContinuations(key={self._summary.key}, width={self.width}, partial={len(self.partial)})"
