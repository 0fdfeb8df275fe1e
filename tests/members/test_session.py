"""A member's session: exact spelling, writing and committing, sitting out, both boundary modes."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ensemble_core.errors import EnsembleWarning
from ensemble_core.members.contract import Boundary, Candidate, Pick, RequestId
from ensemble_core.members.encoding import ExactEncoder
from ensemble_core.vocab import incomplete_utf8_suffix, token_table
from reference import ATOL, uncached_all_logits, uncached_next_logits

RID = RequestId(1)


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
    assert ids is not None and table.spell(ids) == text
    assert all(table.token_bytes[i] is not None for i in ids)  # never a special token


def test_exact_encoder_says_so_when_it_cannot_spell(load_tokenizer) -> None:
    tokenizer = load_tokenizer("smollm2-135m-instruct")  # no token for the byte 0x04
    table = token_table(tokenizer)
    assert table.byte_tokens[0x04] is None
    assert ExactEncoder(tokenizer, table).encode(b"the caf\x04 is") is None


CHUNKED_TEXT = st.lists(
    st.sampled_from(["Hello", " world", ",", " 你好", "🙂", "\n", "  ", "def", " f", "(x)", ":", "é", "ing", "s"]),
    min_size=1,
    max_size=12,
).map("".join)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_retokenize_keeps_ids_spelling_the_text_at_every_byte(arch: str, tiny_member) -> None:
    member = tiny_member(arch)

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(CHUNKED_TEXT, st.randoms(use_true_random=False))
    def check(text: str, rng: random.Random) -> None:
        data = text.encode()
        session = member.start({RID: member.render("x")}, Boundary.RETOKENIZE)
        committed = b""
        while committed != data:
            size = rng.randint(1, 5)  # byte chunks: characters get split on purpose
            chunk = data[len(committed) : len(committed) + size]
            session.commit(RID, chunk)
            committed += chunk
            # Every byte is in the member's ids at once, split characters as byte tokens.
            assert member.table.spell(session.token_ids(RID)) == committed
            assert not session.lagging(RID)
        assert member.table.spell(session.token_ids(RID)) == data

    check()


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_retokenize_logits_stay_exact_after_syncs_that_rewrite_the_tail(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    prompt = member.render("The")
    session = member.start({RID: prompt}, Boundary.RETOKENIZE)
    chunks = [b" hel", b"lo", b" wor", b"ld", b"wide", b" \xe4\xbd", b"\xa0\xe5\xa5\xbd", b" un", b"believ", b"able"]
    for chunk in chunks:
        session.commit(RID, chunk)
        [distribution] = session.next([RID])
        ids = prompt.ids + session.token_ids(RID)
        expected = torch.softmax(uncached_next_logits(member.model, ids).float(), dim=-1)
        torch.testing.assert_close(distribution.dense, expected, atol=ATOL, rtol=0)
    assert member.table.spell(session.token_ids(RID)) == b"".join(chunks)
    assert session.stats().rollbacks > 0  # " hel"+"lo" is not how any of these tokenizers spells " hello"


@pytest.mark.parametrize("boundary", list(Boundary))
def test_what_a_member_writes_is_kept_without_re_encoding(boundary: Boundary, tiny_member) -> None:
    member = tiny_member("tiny-qwen2")
    tokenizer = member.tokenizer
    session = member.start({RID: member.render("x")}, boundary)
    # "hel" + "lo" as the member's OWN two tokens: kept as they are, though " hello" is one token.
    own = [tokenizer.convert_tokens_to_ids(t) for t in ("Ġhel", "lo")]
    [distribution] = session.next([RID])
    if not distribution.exact:  # the raw prompt's end is re-read first: commit nothing, write whole
        pytest.skip("covering at the prompt's end")
    for token in own:
        [distribution] = session.next([RID])
        assert session.write(RID, distribution, Pick(-1, token))
    session.commit(RID, b" hello")
    assert session.token_ids(RID)[-2:] == own
    assert session.stats().own_tokens == 2


def test_a_written_draft_is_kept_only_as_far_as_the_commit_confirms_it(tiny_member) -> None:
    member = tiny_member("tiny-llama")
    session = member.start({RID: member.render("x")}, Boundary.RETOKENIZE)
    table = member.table
    draft = [member.tokenizer.encode(t, add_special_tokens=False)[0] for t in (" the", " cat", " sat")]
    for token in draft:
        [distribution] = session.next([RID])
        assert session.write(RID, distribution, Pick(-1, token))
    session.commit(RID, b" the cat ran")  # the third piece was not committed
    ids = session.token_ids(RID)
    assert ids[:2] == draft[:2] and table.spell(ids) == b" the cat ran"
    [after] = session.next([RID])
    expected = torch.softmax(uncached_next_logits(member.model, member.render("x").ids + ids).float(), dim=-1)
    torch.testing.assert_close(after.dense, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("boundary", list(Boundary))
def test_scores_of_candidates_equal_fresh_forwards(boundary: Boundary, tiny_member) -> None:
    member = tiny_member("tiny-gemma3")
    prompt = member.render("The old lighthouse keeper looked at the sea and")
    session = member.start({RID: prompt}, boundary)
    session.next([RID])
    texts = [b" smiled.", b" said nothing at all", " 看见了一艘船 🙂".encode()]
    [scores] = session.score([RID], [[Candidate(t) for t in texts]])
    for text, score in zip(texts, scores, strict=True):
        if boundary is Boundary.RETOKENIZE:
            ids = member.vocab.encode(text)
            logprobs = uncached_all_logits(member.model, prompt.ids + ids).float().log_softmax(-1)
            expected = torch.tensor([float(logprobs[len(prompt.ids) - 1 + j, t]) for j, t in enumerate(ids)])
            torch.testing.assert_close(score.values, expected, atol=1e-4, rtol=0)
        else:  # the corrected score is log p(text | committed text): a log-probability, finite
            assert torch.isfinite(score.values).all() and float(score.values.sum()) < 0


@pytest.mark.parametrize("boundary", list(Boundary))
def test_a_member_that_cannot_spell_the_text_sits_out_and_says_so_once(boundary: Boundary, tiny_member) -> None:
    member = tiny_member("tiny-llama")  # SmolLM2's tokenizer: no token for the byte 0x04
    session = member.start({RID: member.render("The cafe")}, boundary)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session.commit(RID, b" \x04 is")
        first = session.next([RID])
        session.commit(RID, b" open")
        second = session.next([RID])
    assert first == [None] and second == [None]  # never continues from a different text
    assert session.lagging(RID)
    assert [w.category for w in caught] == [EnsembleWarning]
    assert "cannot spell" in str(caught[0].message)
    stats = session.stats()
    assert stats.unspellable == 1 and stats.sat_out == 2
