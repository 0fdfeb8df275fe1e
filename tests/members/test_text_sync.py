"""Keeping a member's ids in step with committed text: exact bytes, short tails, exact logits."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ensemble_core.members.text_sync import ExactEncoder, incomplete_utf8_suffix
from ensemble_core.vocab import token_table
from reference import ATOL, uncached_next_logits


@pytest.mark.parametrize(
    ("data", "held"),
    [
        (b"abc", 0),
        ("é".encode(), 0),
        ("é".encode()[:1], 1),
        ("你".encode()[:2], 2),
        ("🙂".encode()[:3], 3),
        ("🙂".encode(), 0),
        (b"ok\xff", 0),  # can never become valid: passed on, not held
        (b"\x80\x80", 0),  # stray continuation bytes: same
    ],
)
def test_incomplete_utf8_suffix(data: bytes, held: int) -> None:
    assert incomplete_utf8_suffix(data) == held


@pytest.mark.parametrize(
    ("family", "text"),
    [
        ("mistral-7b", b"world"),  # a dummy prefix would add a space: the anchor removes it
        ("mistral-7b", b" world\n  x"),
        ("qwen2.5-coder-0.5b-instruct", b"say <|im_end|> now"),  # literal special-token text
        ("qwen2.5-coder-0.5b-instruct", "cafe\u0301".encode()),  # NFC would change these bytes
        ("gemma-3-270m", b"\xff\xfe ok"),  # not UTF-8 at all: byte tokens
        ("smollm2-135m-instruct", "  def f():\n\treturn 1 你好".encode()),
    ],
)
def test_exact_encoder_spells_exactly_the_bytes(family: str, text: bytes, load_tokenizer) -> None:
    tokenizer = load_tokenizer(family)
    table = token_table(tokenizer)
    ids = ExactEncoder(tokenizer, table).encode(text)
    assert table.spell(ids) == text
    assert all(table.token_bytes[i] is not None for i in ids)  # never a special token


CHUNKED_TEXT = st.lists(
    st.sampled_from(["Hello", " world", ",", " 你好", "🙂", "\n", "  ", "def", " f", "(x)", ":", "é", "ing", "s"]),
    min_size=1,
    max_size=12,
).map("".join)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_committing_any_byte_chunks_keeps_ids_spelling_the_text_at_every_byte(arch: str, tiny_member) -> None:
    member = tiny_member(arch)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(CHUNKED_TEXT, st.randoms(use_true_random=False))
    def check(text: str, rng: random.Random) -> None:
        data = text.encode()
        session = member.start([member.render("x")])
        committed = b""
        while committed != data:
            size = rng.randint(1, 5)  # byte chunks: characters get split on purpose
            chunk = data[len(committed) : len(committed) + size]
            session.commit(0, chunk)
            committed += chunk
            # Every byte is in the member's ids at once, split characters as byte tokens.
            assert member.table.spell(session.generated_ids(0)) == committed
            assert session.held(0) == b""
        assert member.table.spell(session.generated_ids(0)) == data

    check()


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_logits_stay_exact_after_syncs_that_rewrite_the_tail(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    session = member.start([member.render("The")])
    chunks = [b" hel", b"lo", b" wor", b"ld", b"wide", b" \xe4\xbd", b"\xa0\xe5\xa5\xbd", b" un", b"believ", b"able"]
    for chunk in chunks:
        session.commit(0, chunk)
        ids = session.batch.ids(0)
        torch.testing.assert_close(session.next_logits()[0], uncached_next_logits(member.model, ids), atol=ATOL, rtol=0)
    assert member.table.spell(session.generated_ids(0)) == b"".join(chunks)
    stats = session.stats()
    assert stats.rollbacks > 0  # " hel"+"lo" is not how any of these tokenizers spells " hello"
    assert session.batch.ids(0)[: len(member.render("The"))] == member.render("The")  # prompt ids never change


def test_own_token_is_kept_without_re_encoding(tiny_member) -> None:
    member = tiny_member("tiny-qwen2")
    tokenizer = member.tokenizer
    session = member.start([member.render("x")])
    # "hel" + "lo" as the member's OWN two tokens: kept as they are, though " hello" is one token.
    own = [tokenizer.convert_tokens_to_ids(t) for t in ("Ġhel", "lo")]
    for token in own:
        session.commit(0, member.table.token_bytes[token], own_tokens=[token])
    assert session.generated_ids(0) == own
    assert session.stats().own_tokens == 2 and session.stats().reencoded_tokens == 0
