"""A hosted member's distribution as it crosses the wire: the methods read the same numbers from
the summary as from the whole distribution (real tokenizers, no model, no Ray: the host's
answers are called in process)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from ensemble_core.members.contract import Continuations, PartialGroup, Pick
from ensemble_core.members.own_choice import greedy_choice, pick_prob, pick_text
from ensemble_core.members.ray_member import MemberHost
from ensemble_core.members.wire import (
    PARTIAL_SENT,
    SUMMARY_TOP_KS,
    PartialSummary,
    SummarizedContinuations,
    SummarizedPartialGroup,
    summarize,
)
from ensemble_core.methods.combine import Combiner


def over_the_wire(vocab, found: Continuations, asked: Counter) -> SummarizedContinuations:
    """What the driver holds of `found` hosted elsewhere: its summary, with the host's answers."""
    summary = summarize(found, 1, SUMMARY_TOP_KS, greedy_choice(vocab, found))

    def fetch(what, argument):
        asked[what] += 1
        return MemberHost._about(found, what, argument, vocab)

    return SummarizedContinuations(summary, None, fetch, lambda k: None)


def texts(step, entries: torch.Tensor) -> list[bytes | None]:
    known, nowhere = step.union.entries, step.nowhere  # read once: a full union has 420k entries
    return [None if e == nowhere else known[e] if e < nowhere else step.text(e) for e in entries.tolist()]


def no_stand_in(member: int, text: bytes) -> None:
    return None


SPELLING_MORE: dict[tuple[int, bytes], list[int]] = {}


def spelling_more(table, text: bytes) -> list[int]:
    """The ids of every token that spells `text` and more."""
    key = (id(table), text)
    if key not in SPELLING_MORE:
        SPELLING_MORE[key] = [
            i for i, b in enumerate(table.token_bytes) if b and len(b) > len(text) and b.startswith(text)
        ]
    return SPELLING_MORE[key]


def space_led_group(member, generator: torch.Generator, sharpness: float, skip_text: bytes) -> PartialGroup:
    """Every token of the member that spells `skip_text` and more: the group after committed
    `skip_text` (after a space: tens of thousands), with random probabilities summing to 0.6."""
    ids = spelling_more(member.vocab.table, skip_text)
    probs = torch.softmax(torch.randn(len(ids), generator=generator) * sharpness, -1) * 0.6
    return PartialGroup(len(skip_text), torch.tensor(ids), probs, route=3)


def steps_here_and_there(vocabs, union, local: dict, asked: Counter):
    """The same step combined from the whole distributions (here) and from what crosses the wire
    for members with partial groups (there), weights 0.5 / 0.3 / 0.2."""
    wired = {i: over_the_wire(vocabs[i], d, asked) if d.partial else d for i, d in local.items()}
    combiner = Combiner(union, vocabs, [0.5, 0.3, 0.2], torch.device("cpu"))
    return combiner.step(local), combiner.step(wired)


def test_a_large_partial_group_crosses_as_its_most_likely_candidates(packaged_members) -> None:
    qwen = packaged_members[0]
    generator = torch.Generator().manual_seed(1)
    group = space_led_group(qwen, generator, 6.0, b" ")
    assert len(group.token_ids) > 10 * PARTIAL_SENT  # every space-led token
    dense = torch.softmax(torch.randn(qwen.logits_width, generator=generator), -1) * 0.4
    found = Continuations(dense, (group, PartialGroup(1, group.token_ids[:5], group.probs[:5] * 0)))
    asked: Counter = Counter()
    wired = over_the_wire(qwen.vocab, found, asked)
    big, small = wired.partial
    assert isinstance(big, SummarizedPartialGroup) and not big.complete
    assert type(small) is PartialGroup and torch.equal(small.token_ids, group.token_ids[:5])  # small: whole
    summary = summarize(found, 1, SUMMARY_TOP_KS, None).partial[0]
    assert isinstance(summary, PartialSummary) and len(summary.token_ids) == PARTIAL_SENT
    # what is sent is the most likely candidates, and the bound holds every other one
    ids, probs = big.known()
    assert torch.equal(probs, torch.sort(group.probs, descending=True).values[:PARTIAL_SENT])
    outside = torch.ones(len(group.probs), dtype=torch.bool)
    outside[torch.isin(group.token_ids, ids)] = False
    assert float(group.probs[outside].max()) <= big.unknown_bound
    assert big.unknown_mass == pytest.approx(float(group.probs[outside].double().sum()), rel=1e-9)
    # picks name the same candidates, answered from the summary where it can
    for index in (int(torch.argmax(group.probs)), int(torch.argmin(group.probs))):
        pick = Pick(0, index)
        assert pick_text(qwen.vocab, wired, pick) == pick_text(qwen.vocab, found, pick)
        assert pick_prob(wired, pick) == pick_prob(found, pick)
    assert asked == {"group": 1}  # the least likely candidate is not sent: the group came whole
    assert big.complete and torch.equal(big.probs, group.probs) and torch.equal(big.token_ids, group.token_ids)


def test_methods_read_the_same_numbers_from_the_summary_and_move_whole_groups_only_for_the_full_union(
    packaged_members, packaged_union
) -> None:
    """GaC's exact shortcut, the masses of any entry, UniTE's candidates and the full union, with
    Qwen and Gemma after a committed space (every space-led token re-covers it) and their groups
    crossing in part: equal to the numbers of the whole distributions; a whole group crosses only
    where the full union is read (sampling, the shortcut's rare fallback)."""
    generator = torch.Generator().manual_seed(0)
    vocabs = [m.vocab for m in packaged_members]
    decided = 0
    for trial in range(8):
        sharpness = 0.0 if trial % 4 == 0 else 8.0  # uniform: thousands of exact ties
        local = {}
        for i, member in enumerate(packaged_members):
            dense = torch.softmax(torch.randn(member.logits_width, generator=generator) * sharpness, -1)
            groups = ()
            if i != 1:  # Qwen and Gemma: a large group, and a small one (after "  ", two spaces)
                large = space_led_group(member, generator, sharpness, b" ")
                small = space_led_group(member, generator, sharpness, b"  ")
                groups = (large, PartialGroup(2, small.token_ids, small.probs / 6))
                dense = dense * 0.3
            local[i] = Continuations(dense, groups)
        asked: Counter = Counter()
        here, there = steps_here_and_there(vocabs, packaged_union, local, asked)
        for i in local:
            yours, mine = there.own(i), here.own(i)
            assert (yours.pick, there.text(yours.entry), yours.mass) == (mine.pick, here.text(mine.entry), mine.mass)
        entry, by_shortcut = there.greedy()
        assert there.text(entry) == here.text(here.greedy()[0]) and by_shortcut == here.greedy()[1]
        decided += by_shortcut
        assert asked["group"] == (0 if by_shortcut else 2)
        for i in local:
            probe = torch.randint(0, packaged_union.size, (300,), generator=generator)
            heavy = torch.from_numpy(here.partial[i][0][:100]).clamp(max=packaged_union.size - 1)
            probe = torch.unique(torch.cat([probe, heavy]))
            assert torch.equal(there.mass(i, probe), here.mass(i, probe))
        for yours, mine in (
            (there.unite(10, no_stand_in), here.unite(10, no_stand_in)),
            (there.full_scored(), here.full_scored()),
        ):
            # this step's own entries are numbered as texts turn up: texts and order must agree
            assert texts(there, yours.entries) == texts(here, mine.entries)
            assert torch.equal(yours.probs, mine.probs)
        assert there.text(there.pick(there.full_scored())) == here.text(here.pick(here.full_scored()))
        assert there.text(entry) == there.text(there.pick(there.full_scored()))  # the bound held
        assert asked["group"] == 2  # the full union needs every candidate (once)
    assert decided == 8  # the shortcut decided every step without a whole group, even the uniform ones


def test_sharpening_reads_one_number_per_member_and_word_not_the_full_union(packaged_members, packaged_union) -> None:
    """SAFE's sharpening over GaC's full distribution: each entry above the threshold gains the
    mass of every candidate extending its text. Asked of hosted members (Qwen and Gemma after a
    committed space, their large groups crossing in part) as one sum each, it equals the sum
    over the full distribution held here, and no whole distribution or group crosses."""
    generator = torch.Generator().manual_seed(3)
    vocabs = [m.vocab for m in packaged_members]
    words = [b"Gen", b" the", b"    ", b" "]  # inside a word, a word, a whitespace run, a bare space
    sharpened_steps = 0
    for _ in range(6):
        local = {}
        for i, member in enumerate(packaged_members):
            logits = torch.randn(member.logits_width, generator=generator) * 2.0
            for word in words:  # a few heavy candidates spelling each word and more, as a split word has
                ids = member.vocab.table.ids_starting_with(word)
                ids = ids[ids < member.logits_width][:40]
                logits[ids] += 9.0 + torch.rand(len(ids), generator=generator) * 3
            dense = torch.softmax(logits, -1)
            groups = ()
            if i != 1:
                groups = (space_led_group(member, generator, 8.0, b" "),)
                dense = dense * 0.4
            local[i] = Continuations(dense, groups)
        asked: Counter = Counter()
        here, there = steps_here_and_there(vocabs, packaged_union, local, asked)
        full = here.full_scored()
        full_texts, full_probs = texts(here, full.entries), full.probs.tolist()
        threshold = float(torch.sort(full.probs, descending=True).values[3]) * 0.999  # the top three pass
        above = there.above(threshold)
        assert above is not None, "the shortcut's bound should rule out every other entry here"
        heavy = [t for t, p in zip(full_texts, full_probs, strict=True) if p > threshold]
        assert sorted(texts(there, above.entries)) == sorted(heavy)
        drafter = 0
        sharpened = there.sharpen_heuristic(above, drafter, threshold, over_all=True)
        local_sharpened = here.sharpen_heuristic(full, drafter, threshold, over_all=True)
        assert sharpened is not None and local_sharpened is not None
        sharpened_steps += 1
        assert texts(there, sharpened.entries) == texts(here, local_sharpened.entries)
        assert torch.equal(sharpened.probs, local_sharpened.probs)  # the same exact sums, to the bit
        for entry, gained in zip(sharpened.entries.tolist(), sharpened.probs.tolist(), strict=True):
            prefix = there.text(entry)
            extending = [p for t, p in zip(full_texts, full_probs, strict=True) if t and t.startswith(prefix)]
            brute = sum(extending)
            assert gained == pytest.approx(brute, abs=1e-5)
        assert asked["dense"] == 0 and asked["group"] == 0
        assert asked["mass_extending"] <= 2 * len(sharpened.entries)  # one number per hosted member and word
    assert sharpened_steps == 6
