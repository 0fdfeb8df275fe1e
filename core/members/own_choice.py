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

from dataclasses import dataclass

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
    dense = distribution.dense
    first = int(torch.argmax(dense))
    index, texts, _ = vocab.table.text_index
    usable = min(len(index), dense.shape[0])
    targets = index[:usable].to(dense.device)
    ends = sorted(e for e in vocab.eos_ids if e < dense.shape[0])
    keep = targets >= 0
    keep[[e for e in ends if e < usable]] = False
    masses = torch.zeros(len(texts) + 1, dtype=torch.float32, device=dense.device)
    masses.index_add_(0, torch.where(keep, targets, len(texts)), dense[:usable].float())
    masses[len(texts)] = 0.0
    extra_text, extra_mass = _add_partial_masses(vocab, distribution, masses)
    best = int(torch.argmax(masses))
    mass = float(masses[best])
    first_text = vocab.text_of(first)
    if first_text and first not in vocab.eos_ids and float(masses[int(index[first])]) == mass:
        best = int(index[first])  # a tie: the text of the member's top id
    best_text = texts[best] if mass > 0 else b""
    if extra_mass > mass:
        best_text, mass = extra_text, extra_mass
    end_mass = float(dense[ends].sum()) if ends else 0.0
    control = float(dense[first]) if not first_text and first not in vocab.eos_ids else -1.0
    if control >= 0.0 and control >= mass and control >= end_mass:  # the top id is a control token
        return Choice(Pick(-1, first), b"", False, control)  # (no text; ties go to the top id)
    if ends and (end_mass > mass or (end_mass == mass and first in vocab.eos_ids)):
        strongest = max(ends, key=lambda e: float(dense[e]))
        return Choice(Pick(-1, strongest), b"", True, end_mass)
    return Choice(_best_pick(vocab, distribution, best_text), best_text, False, mass)


def _whole_token_choice(vocab: MemberVocab, dense: torch.Tensor) -> Choice:
    """`greedy_choice` over whole tokens only, decided on the distribution's device with one
    read: the same rule as the general path, step for step."""
    tables = choice_tables(vocab, dense.shape[0], dense.device)
    dense = dense.float()
    first = torch.argmax(dense)
    masses = tables.texts.sum(dense)
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
    packed = torch.stack([first, best, torch.argmax(spelling), strongest]).double()
    values = torch.cat([packed, torch.stack([mass, end_mass, dense[first]]).double()]).tolist()  # the one read
    top, text_index, pick, strongest_end = (int(v) for v in values[:4])
    mass_value, end_value, top_prob = values[4:]
    top_text = vocab.text_of(top)
    control = top_prob if not top_text and top not in vocab.eos_ids else -1.0
    if control >= 0.0 and control >= mass_value and control >= end_value:  # the top id is a control token
        return Choice(Pick(-1, top), b"", False, control)
    if len(tables.ends) and (end_value > mass_value or (end_value == mass_value and top in vocab.eos_ids)):
        return Choice(Pick(-1, strongest_end), b"", True, end_value)
    if mass_value <= 0:
        raise RuntimeError("no candidate spells the chosen text")
    _, texts, _ = vocab.table.text_index
    return Choice(Pick(-1, pick), texts[text_index], False, mass_value)


def _add_partial_masses(vocab: MemberVocab, distribution: Continuations, masses: torch.Tensor) -> tuple[bytes, float]:
    """Adds partial candidates' masses to `masses` (texts some whole token also spells); returns
    the heaviest text no whole token spells, with its mass (b"", 0.0 when there is none).

    Vectorised over each group (a group can hold tens of thousands of candidates: after a
    committed space, every token that starts with a space)."""
    extra: dict[bytes, float] = {}
    for group in distribution.partial:
        suffixes = vocab.table.suffixes(group.skip)
        ids = group.token_ids.cpu()
        text_ids = suffixes.ids[ids.clamp(max=len(suffixes.ids) - 1)]
        text_ids[ids >= len(suffixes.ids)] = -1
        positions = torch.where(text_ids >= 0, vocab.table.suffix_positions(group.skip)[text_ids.clamp(min=0)], -1)
        probs = group.probs.float().cpu()
        whole = positions >= 0
        if bool(whole.any()):
            masses.index_add_(0, positions[whole].to(masses.device), probs[whole].to(masses.device))
        alone = (text_ids >= 0) & ~whole & (probs > 0)
        if bool(alone.any()):
            unique, inverse = torch.unique(text_ids[alone], return_inverse=True)
            # float64, in candidate order: the sums a plain Python loop over the candidates makes
            summed = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, probs[alone].double())
            for text_id, value in zip(unique.tolist(), summed.tolist(), strict=True):
                text = suffixes.texts[text_id]
                extra[text] = extra.get(text, 0.0) + value
    if not extra:
        return b"", 0.0
    text = max(extra, key=extra.__getitem__)
    return text, extra[text]


def _best_pick(vocab: MemberVocab, distribution: Continuations, text: bytes) -> Pick:
    """The member's single most likely candidate spelling `text` (the first among equals)."""
    best, best_prob = None, -1.0
    for token in vocab.table.ids_by_bytes.get(text, ()):
        if token < distribution.dense.shape[0] and token not in vocab.eos_ids:
            prob = float(distribution.dense[token])
            if prob > best_prob:
                best, best_prob = Pick(-1, token), prob
    for g, group in enumerate(distribution.partial):
        suffixes = vocab.table.suffixes(group.skip)
        target = suffixes.position.get(text)
        if target is None:
            continue
        ids = group.token_ids.cpu()
        inside = ids < len(suffixes.ids)
        same = torch.zeros_like(inside)
        same[inside] = suffixes.ids[ids[inside]] == target
        if not bool(same.any()):
            continue
        probs = group.probs.float().cpu().masked_fill(~same, -1.0)
        k = int(torch.argmax(probs))
        if float(probs[k]) > best_prob:
            best, best_prob = Pick(g, k), float(probs[k])
    if best is None:
        raise RuntimeError("no candidate spells the chosen text")
    return best


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
