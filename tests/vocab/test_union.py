"""The union vocabulary and the combinations over it (no model needed: real tokenizers only)."""

from __future__ import annotations

import pytest
import torch

from ensemble_core.members.contract import Continuations, PartialGroup
from ensemble_core.methods.combine import Combiner
from ensemble_core.methods.token import union_for
from ensemble_core.vocab.union import EOS_INDEX, build_union


@pytest.fixture(scope="module")
def members(packaged_members):
    return packaged_members


@pytest.fixture(scope="module")
def union(packaged_union):
    return packaged_union


def combiner(members, union, weights) -> Combiner:
    return Combiner(union, [m.vocab for m in members], weights, torch.device("cpu"))


def step(members, union, weights, dense: dict[int, torch.Tensor], partial=None):
    distributions = {m: Continuations(probs, tuple((partial or {}).get(m, ()))) for m, probs in dense.items()}
    return combiner(members, union, weights).step(distributions)


def test_entries_are_sorted_bytes_with_one_end_of_sequence_entry(members, union) -> None:
    assert union.entries[EOS_INDEX] == b""
    assert union.entries == sorted(union.entries)
    assert len(set(union.entries)) == union.size
    for member, member_map in zip(members, union.maps, strict=True):
        for eos in member.eos_token_ids:
            assert int(member_map.to_union[eos]) == EOS_INDEX
        token = member.tokenizer.encode(" there", add_special_tokens=False)[0]
        assert union.entries[int(member_map.to_union[token])] == member.table.token_bytes[token]


def test_padded_logit_rows_and_other_special_tokens_map_nowhere(members, union) -> None:
    qwen_map = union.maps[0]
    assert qwen_map.to_union.shape[0] == 151936  # the logits width, not the tokenizer's 151,665
    assert bool((qwen_map.to_union[151665:] == union.nowhere).all())
    im_start = members[0].tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert int(qwen_map.to_union[im_start]) == union.nowhere


def test_the_union_is_built_once_per_member_set(members, union) -> None:
    assert union_for([m.vocab for m in members]) is union
    assert (
        build_union([m.table for m in members], [m.eos_token_ids for m in members], [m.logits_width for m in members])
        is union
    )


def test_duplicate_ids_add_up_and_low_precision_accumulates_in_float32(members, union) -> None:
    gemma = 2
    entry, extra = next(iter(union.maps[gemma].extra_ids.items()))
    first = int(union.maps[gemma].first_id[entry])
    probs = torch.zeros(members[gemma].logits_width)
    probs[first], probs[extra[0]] = 0.25, 0.5
    assert float(step(members, union, [0.0, 0.0, 1.0], {gemma: probs}).full()[entry]) == pytest.approx(0.75)
    bf16 = torch.softmax(torch.randn(members[0].logits_width), -1).to(torch.bfloat16)
    total = step(members, union, [1.0, 0.0, 0.0], {0: bf16}).full()
    assert total.dtype == torch.float32
    mapped = union.maps[0].to_union < union.nowhere
    assert float(total.sum()) == pytest.approx(float(bf16.double()[mapped].sum()), abs=1e-5)


def test_ids_starting_with_are_exactly_the_tokens_spelling_a_prefix_and_more(members) -> None:
    """Prefixes inside words, whitespace runs, a UTF-8 lead byte, 0xff (no byte after it) and
    nothing at all, on the three packaged tables (byte-level and SentencePiece)."""
    prefixes = [b" there", b"a", b"Gen", b"    ", b"\n", "é".encode()[:1], b"\xff", b"\xe4\xb8", b"zzzzqq"]
    for member in members:
        table = member.vocab.table
        for prefix in prefixes:
            found = table.ids_starting_with(prefix).tolist()
            assert found == [i for i, b in enumerate(table.token_bytes) if b and b.startswith(prefix)]
    qwen = members[0].vocab.table
    assert len(qwen.ids_starting_with(b"")) == sum(bool(b) for b in qwen.token_bytes)


def test_greedy_shortcut_equals_the_full_argmax_with_partial_candidates(members, union) -> None:
    """Exact whatever the distributions, also with candidates from tokens that re-cover committed
    bytes (texts that are, or are not, union entries)."""
    generator = torch.Generator().manual_seed(0)
    shortcut_used = 0
    qwen = members[0]
    covering = torch.tensor(
        [qwen.tokenizer.convert_tokens_to_ids(t) for t in ("ĠGenerator", "ĠGeneral", "ĠGeneration")]
    )
    for trial in range(40):
        sharpness = 1.0 if trial % 4 == 0 else 8.0  # flat distributions force the fallback path
        dense = {
            i: torch.softmax(torch.randn(m.logits_width, generator=generator) * sharpness, -1)
            for i, m in enumerate(members)
        }
        partial = {}
        if trial % 2:  # Qwen also offers "erator"/"eral"/"eration" from tokens re-covering " Gen"
            share = torch.softmax(torch.randn(3, generator=generator) * 4, -1) * 0.5
            dense[0] = dense[0] * 0.5
            partial[0] = [PartialGroup(4, covering, share)]
        found = step(members, union, [0.5, 0.3, 0.2], dense, partial)
        entry, by_shortcut = found.greedy()
        full = found.full()
        assert entry == int(torch.argmax(full))
        shortcut_used += by_shortcut
    assert 0 < shortcut_used < 40  # both paths were exercised
