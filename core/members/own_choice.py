"""A member's own choice from its distribution: what it would write if it decoded alone.

Greedy: its most likely TEXT, written with that text's single most likely candidate. A text's
mass is what every candidate spelling it adds up to: ids with the same bytes (Gemma's `\n` is
an added token and a byte token), all of the member's end-of-sequence ids (Qwen's
`<|im_end|>` and `<|endoftext|>` both end the text), and, with prompt-boundary correction,
candidates from tokens that re-cover committed bytes. This is exactly how the union vocabulary
adds a member's probabilities up, so one model twice, or weights (1, 0), reproduce that model
alone bit for bit. It equals transformers' greedy `generate` except where two of the member's
ids spelling one text (or two end ids) together outweigh its top id: `generate` picks the id,
we pick the text. Ties go to the text of the member's top id.

Sampling: a seeded draw after top-p over all its candidates (aggregation does not change the
distribution of the text drawn). The same rule serves `Single`, drafters, the ensemble's test of
which members wrote the chosen text, and a hosted member's actor (which makes the choice where
the distribution is, so only the choice crosses the wire): it belongs to the members' layer.

GPU-ready: a distribution that is all whole tokens (no boundary-correction candidates) is
decided on its device and read by Python ONCE (one packed tensor: top id, best text, its best id,
the end-of-text mass and the strongest end id); texts add up through a `SegmentPlan`, in a fixed
order, so the sums and so the tie rule are the same on every run and device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.members.contract import Continuations, MemberVocab, Pick
from ensemble_core.sampling import draw
from ensemble_core.vocab.segments import SegmentPlan


@dataclass(frozen=True)
class Choice:
    """A member's candidate: its `pick`, the text it adds, whether it ends the text, and the
    probability the member gives that text (all candidates spelling it, when greedy)."""

    pick: Pick
    text: bytes
    eos: bool
    prob: float

    @property
    def control(self) -> bool:
        """A control token: no text, and not the end (e.g. `<|im_start|>`)."""
        return not self.text and not self.eos


def pick_text(vocab: MemberVocab, distribution: Continuations, pick: Pick) -> tuple[bytes, bool]:
    """(the text a candidate adds, whether it ends the text)."""
    if pick.group == -1:
        if pick.index in vocab.eos_ids:
            return b"", True
        return vocab.text_of(pick.index) or b"", False
    group = distribution.partial[pick.group]
    return (vocab.text_of(group.token(pick.index)) or b"")[group.skip :], False


def pick_prob(distribution: Continuations, pick: Pick) -> float:
    if pick.group == -1:
        return float(distribution.probs_at(torch.tensor([pick.index], device=distribution.device))[0])
    return distribution.partial[pick.group].prob(pick.index)


@dataclass(frozen=True)
class ChoiceTables:
    """A member's id -> text structures for one logits width, on one device.

    Attributes:
        texts: adds ids into their texts (end-of-sequence ids, special tokens and padded
            logit rows add nowhere).
        text_of_id: LongTensor [width]: each id's text index, -1 where it adds nowhere.
        ends: LongTensor: the end-of-sequence ids below the width, ascending.
    """

    texts: SegmentPlan
    text_of_id: torch.Tensor
    ends: torch.Tensor


def choice_tables(vocab: MemberVocab, width: int, device: torch.device) -> ChoiceTables:
    """Built once per member table, width and end ids, moved once per device, then kept."""
    cache = vocab.table.__dict__.setdefault("_choice_tables", {})
    key = (width, vocab.eos_ids)
    if key not in cache:
        index, texts, _ = vocab.table.text_index
        slots = [-1] * width
        for token, text in enumerate(index[: min(len(index), width)].tolist()):
            if text >= 0 and token not in vocab.eos_ids:
                slots[token] = text
        ends = sorted(e for e in vocab.eos_ids if e < width)
        cache[key] = {
            torch.device("cpu"): ChoiceTables(
                SegmentPlan.of(slots, len(texts)),
                torch.tensor(slots, dtype=torch.long),
                torch.tensor(ends, dtype=torch.long),
            )
        }
    placed = cache[key]
    if device not in placed:
        home = placed[torch.device("cpu")]
        placed[device] = ChoiceTables(home.texts.on(device), home.text_of_id.to(device), home.ends.to(device))
    return placed[device]


def greedy_choice(vocab: MemberVocab, distribution: Continuations) -> Choice:
    """The member's own greedy choice (see the module docstring)."""
    if distribution.greedy is not None:
        return distribution.greedy  # made where the distribution was (the same rule, on the same table)
    if not distribution.partial:
        return _whole_token_choice(vocab, distribution.dense)
    return _partial_choice(vocab, distribution)


def _whole_token_choice(vocab: MemberVocab, dense: torch.Tensor) -> Choice:
    """`greedy_choice` over whole tokens only, decided on the distribution's device with one read."""
    return _choice_from(vocab, _choice_pack(vocab, dense.float()).tolist())


def _choice_pack(vocab: MemberVocab, dense: torch.Tensor, masses: torch.Tensor | None = None) -> torch.Tensor:
    """float64 [8] on `dense`'s device: the general rule's numbers for a distribution (top id,
    best text, that text's likeliest id, strongest end id, the text's mass, the end mass, the
    top id's probability, the likeliest id's probability), computed there without reading
    anything. `masses`: the texts' masses when more than whole tokens add to them."""
    tables = choice_tables(vocab, dense.shape[0], dense.device)
    first = torch.argmax(dense)
    masses = tables.texts.sum(dense) if masses is None else masses
    best = torch.argmax(masses)
    mass = masses[best]
    first_text = tables.text_of_id[first]
    tied = (first_text >= 0) & (masses[first_text.clamp(min=0)] == mass)
    best = torch.where(tied, first_text, best)  # a tie: the text of the member's top id
    zero = torch.zeros((), device=dense.device)
    if len(tables.ends):
        end_probs = dense[tables.ends]
        end_mass, strongest = end_probs.sum(), tables.ends[torch.argmax(end_probs)]
    else:
        end_mass, strongest = zero, zero.long()
    spelling = torch.where(tables.text_of_id == best, dense, torch.full((), -1.0, device=dense.device))
    pick = torch.argmax(spelling)
    ids = torch.stack([first, best, pick, strongest]).double()
    return torch.cat([ids, torch.stack([mass, end_mass, dense[first], spelling[pick]]).double()])


def _choice_from(vocab: MemberVocab, values: Sequence[float]) -> Choice:
    """The choice `_choice_pack`'s numbers make (the general path's rule, step for step)."""
    top, text_index, pick, strongest_end = (int(v) for v in values[:4])
    mass, end_mass, top_prob = values[4:7]
    control = top_prob if not vocab.text_of(top) and top not in vocab.eos_ids else -1.0
    if control >= 0.0 and control >= mass and control >= end_mass:  # the top id is a control token
        return Choice(Pick(-1, top), b"", False, control)
    has_ends = any(e < vocab.width for e in vocab.eos_ids)
    if has_ends and (end_mass > mass or (end_mass == mass and top in vocab.eos_ids)):
        return Choice(Pick(-1, strongest_end), b"", True, end_mass)
    if mass <= 0:
        raise RuntimeError("no candidate spells the chosen text")
    _, texts, _ = vocab.table.text_index
    return Choice(Pick(-1, pick), texts[text_index], False, mass)


@dataclass(frozen=True)
class Summary:
    """A member's distribution at one step, as the host knows it after one read (`summarize`).

    Attributes:
        top_values / top_ids: its k most likely whole tokens (float32 probabilities, most likely
            first, as `torch.topk` gives them).
        top_sum: their float32 sum; total: the float32 sum of all its whole tokens.
        choice: its own greedy choice.
    """

    top_values: list[float]
    top_ids: list[int]
    top_sum: float
    total: float
    choice: Choice


def summarize(
    items: Sequence[tuple[MemberVocab, Continuations]], top_k: int, also: Sequence[torch.Tensor] = ()
) -> tuple[list[Summary], list[list[float]]]:
    """Every member's `Summary` with ONE read per device: each member's numbers are computed where
    its distribution is, packed, and the packs of one device are read together. A hosted
    member's distribution answers from what already crossed the wire. `also`: more 1-D tensors
    the caller needs now (their values come back second), read in the same read."""
    found: list[Summary | None] = [None] * len(items)
    packs: dict[torch.device, list[tuple[int, int, torch.Tensor, Any]]] = {}
    for index, (vocab, distribution) in enumerate(items):
        if distribution.greedy is not None:  # made where the distribution was (a hosted member)
            values, ids = distribution.top(top_k)
            found[index] = Summary(
                values.tolist(), ids.tolist(), float(values.sum()), distribution.total(), distribution.greedy
            )
            continue
        dense = distribution.dense.float()
        values, ids = torch.topk(dense, min(top_k, dense.shape[0]))
        parts = [torch.stack([values.sum(), dense.sum()]).double(), values.double(), ids.double()]
        prepared = _PartialPrep(vocab, distribution) if distribution.partial else None
        parts.append(_choice_pack(vocab, dense, None if prepared is None else prepared.masses))
        packs.setdefault(dense.device, []).append((index, len(values), torch.cat(parts), prepared))
    extra: list[list[float]] = [[] for _ in also]
    for position, tensor in enumerate(also):
        packs.setdefault(tensor.device, []).append((-1 - position, 0, tensor.double(), None))
    for pieces in packs.values():
        numbers = torch.cat([pack for _, _, pack, _ in pieces]).tolist()  # the one read of this device
        at = 0
        for index, k, pack, prepared in pieces:
            mine = numbers[at : at + len(pack)]
            at += len(pack)
            if index < 0:
                extra[-1 - index] = mine
                continue
            vocab = items[index][0]
            rule = mine[2 + 2 * k :]
            choice = _choice_from(vocab, rule) if prepared is None else prepared.finish(rule)
            found[index] = Summary(mine[2 : 2 + k], [int(v) for v in mine[2 + k : 2 + 2 * k]], mine[0], mine[1], choice)
    return found, extra  # type: ignore[return-value]


def _partial_choice(vocab: MemberVocab, distribution: Continuations) -> Choice:
    """`greedy_choice` with boundary-correction candidates (two reads: their data, then the rule's
    numbers; inside `summarize` the second is shared with every other member's)."""
    prepared = _PartialPrep(vocab, distribution)
    return prepared.finish(_choice_pack(vocab, prepared.dense, prepared.masses).tolist())


class _PartialPrep:
    """The partial path's host work before its numbers are read: the candidates' data (read once,
    `Continuations.host_groups`) mapped to texts; those spelling a text some whole token also
    spells add to that text's mass on the device (in candidate order, one round per repeat, so
    nothing races); the others are summed per text on the host (float64, in candidate order)."""

    def __init__(self, vocab: MemberVocab, distribution: Continuations):
        self.vocab, self.distribution = vocab, distribution
        table = vocab.table
        self.dense = distribution.dense.float()
        self.groups = distribution.host_groups()
        adds_at, adds = [], []
        self.extra: dict[bytes, float] = {}
        for (ids, probs), group in zip(self.groups, distribution.partial, strict=True):
            suffixes = table.suffixes(group.skip)
            inside = ids < len(suffixes.ids)
            text_ids = np.where(inside, suffixes.ids[ids.clip(max=len(suffixes.ids) - 1)], -1)
            positions = np.where(text_ids >= 0, table.suffix_positions(group.skip)[text_ids.clip(min=0)], -1)
            whole = positions >= 0
            adds_at.append(positions[whole])
            adds.append(probs[whole])
            alone = (text_ids >= 0) & ~whole & (probs > 0)
            if alone.any():
                unique, inverse = np.unique(text_ids[alone], return_inverse=True)
                summed = np.zeros(len(unique), dtype=np.float64)
                np.add.at(summed, inverse, probs[alone].astype(np.float64))
                for text_id, value in zip(unique.tolist(), summed.tolist(), strict=True):
                    text = suffixes.texts[text_id]
                    self.extra[text] = self.extra.get(text, 0.0) + value
        masses = choice_tables(vocab, self.dense.shape[0], self.dense.device).texts.sum(self.dense)
        self.masses = _add_in_order(masses, np.concatenate(adds_at), np.concatenate(adds))

    def finish(self, values: Sequence[float]) -> Choice:
        """The choice from `_choice_pack`'s numbers over `self.masses` (the general rule)."""
        vocab, table = self.vocab, self.vocab.table
        top, text_index, pick, strongest_end = (int(v) for v in values[:4])
        mass, end_mass, top_prob, pick_prob = values[4:8]
        _, texts, _ = table.text_index
        best_text = texts[text_index] if mass > 0 else b""
        best: tuple[Pick, float] | None = (Pick(-1, pick), pick_prob) if mass > 0 and pick_prob >= 0 else None
        if self.extra:
            extra_text = max(self.extra, key=self.extra.__getitem__)
            if self.extra[extra_text] > mass:
                best_text, mass, best = extra_text, self.extra[extra_text], None  # no whole token spells it
        control = top_prob if not vocab.text_of(top) and top not in vocab.eos_ids else -1.0
        if control >= 0.0 and control >= mass and control >= end_mass:  # the top id is a control token
            return Choice(Pick(-1, top), b"", False, control)
        has_ends = any(e < vocab.width for e in vocab.eos_ids)
        if has_ends and (end_mass > mass or (end_mass == mass and top in vocab.eos_ids)):
            return Choice(Pick(-1, strongest_end), b"", True, end_mass)
        for g, ((ids, probs), group) in enumerate(zip(self.groups, self.distribution.partial, strict=True)):
            suffixes = table.suffixes(group.skip)
            target = suffixes.position.get(best_text)
            if target is None:
                continue
            same = (ids < len(suffixes.ids)) & (suffixes.ids[ids.clip(max=len(suffixes.ids) - 1)] == target)
            if not same.any():
                continue
            k = int(np.argmax(np.where(same, probs, -1.0)))  # the first among equals
            if best is None or probs[k] > best[1]:
                best = (Pick(g, k), float(probs[k]))
        if best is None:
            raise RuntimeError("no candidate spells the chosen text")
        return Choice(best[0], best_text, False, mass)


def _add_in_order(masses: torch.Tensor, positions: np.ndarray, probs: np.ndarray) -> torch.Tensor:
    """`masses` with each prob added at its position, in the order given (as a sequential
    float32 loop would), one round per repeat of a position so that no two adds race."""
    if not len(positions):
        return masses
    rank = np.zeros(len(positions), dtype=np.int64)  # how many earlier adds hit the same position
    seen: dict[int, int] = {}
    for k, position in enumerate(positions.tolist()):
        rank[k] = seen.get(position, 0)
        seen[position] = rank[k] + 1
    for r in range(int(rank.max()) + 1):
        chosen = rank == r
        at = torch.from_numpy(positions[chosen]).to(masses.device)
        masses = masses.index_add(0, at, torch.from_numpy(probs[chosen]).to(masses.device))
    return masses


def own_choice(
    vocab: MemberVocab,
    distribution: Continuations,
    settings: GenerationSettings,
    generator: torch.Generator | None,
) -> Choice:
    """What the member writes when it decodes alone: greedy, or a seeded draw after top-p."""
    if settings.greedy or generator is None:
        return greedy_choice(vocab, distribution)
    dense = distribution.dense
    groups = distribution.partial
    flat = dense.float() if not groups else torch.cat([dense.float(), *(g.probs.to(dense.device) for g in groups)])
    index = draw(flat, settings, generator)
    if index < dense.shape[0]:
        pick = Pick(-1, index)
    else:
        index -= dense.shape[0]
        group_index = 0
        while index >= len(groups[group_index].token_ids):
            index -= len(groups[group_index].token_ids)
            group_index += 1
        pick = Pick(group_index, index)
    text, eos = pick_text(vocab, distribution, pick)
    return Choice(pick, text, eos, pick_prob(distribution, pick))
