"""token_bytes: the bytes each id spells, on real tokenizers of eight families."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ensemble_core.vocab import Scheme, TokenKind, token_bytes, token_table

FAMILIES = [
    "gpt2",
    "mistral-7b",
    "qwen3",
    "deepseek-v3",
    "llama-3.2",
    "smollm2-135m-instruct",
    "gemma-3-270m",
    "qwen2.5-coder-0.5b-instruct",
]

# Random Unicode text: letters, marks, symbols, CJK, emoji, whitespace. Left out, with reasons:
# surrogates (not encodable), control characters other than \t \n \r (SmolLM2's vocabulary has
# no token for some of those bytes, so its tokenizer drops them), and U+2581 "▁" (SentencePiece
# spells a space with it, so the literal character cannot survive a SentencePiece round trip),
# and code points from U+40000 up (unassigned planes and private use: their UTF-8 lead bytes
# 0xF1-0xF4 have no token in SmolLM2's vocabulary either).
PIECES = st.one_of(
    st.text(
        st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\u2581", max_codepoint=0x3FFFF),
        max_size=6,
    ),
    st.sampled_from(["\n", "\t", "\r\n", "  ", " ", "你好", "🙂", "👩\u200d💻", "e\u0301", "ß", "  def f():"]),
)
TEXT = st.lists(PIECES, max_size=10).map("".join)


@pytest.mark.parametrize("family", FAMILIES)
def test_joined_token_bytes_spell_the_text(family: str, load_tokenizer) -> None:
    tokenizer = load_tokenizer(family)
    table = token_table(tokenizer)
    specials = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(TEXT)
    def check(text: str) -> None:
        # Qwen's tokenizers normalise to NFC first; compare against the text they actually see.
        text = unicodedata.normalize("NFC", text)
        assume(not any(special in text for special in specials))  # the property is for plain text
        ids = tokenizer.encode(text, add_special_tokens=False)
        spelled = b"".join(table.token_bytes[i] for i in ids)
        expected = text.encode("utf-8")
        if table.adds_dummy_prefix and text and spelled == b" " + expected:
            return  # the one documented difference: SentencePiece's dummy-prefix space
        assert spelled == expected

    check()


@pytest.mark.parametrize(
    ("family", "scheme", "dummy_prefix"),
    [
        ("gpt2", Scheme.BYTE_LEVEL, False),
        ("mistral-7b", Scheme.SENTENCEPIECE, True),
        ("gemma-3-270m", Scheme.SENTENCEPIECE, False),
        ("qwen2.5-coder-0.5b-instruct", Scheme.BYTE_LEVEL, False),
        ("llama-3.2", Scheme.BYTE_LEVEL, False),
    ],
)
def test_scheme_and_dummy_prefix_are_detected(family, scheme, dummy_prefix, load_tokenizer) -> None:
    table = token_table(load_tokenizer(family))
    assert table.scheme is scheme
    assert table.adds_dummy_prefix is dummy_prefix


def test_byte_level_markers_and_byte_fallback_tokens(load_tokenizer) -> None:
    gpt2 = load_tokenizer("gpt2")
    spelled = token_bytes(gpt2)
    assert spelled[gpt2.convert_tokens_to_ids("Ġthe")] == b" the"
    assert spelled[gpt2.convert_tokens_to_ids("Ċ")] == b"\n"
    mistral = load_tokenizer("mistral-7b")
    table = token_table(mistral)
    assert table.token_bytes[mistral.convert_tokens_to_ids("<0xE4>")] == b"\xe4"
    assert table.token_bytes[mistral.convert_tokens_to_ids("▁world")] == b" world"
    assert all(table.byte_tokens[b] is not None for b in range(256))  # byte fallback spells any byte


def test_special_tokens_spell_nothing_and_added_text_tokens_spell_their_text(load_tokenizer) -> None:
    qwen = load_tokenizer("qwen2.5-coder-0.5b-instruct")
    table = token_table(qwen)
    im_end = qwen.convert_tokens_to_ids("<|im_end|>")
    tool_call = qwen.convert_tokens_to_ids("<tool_call>")
    assert table.token_bytes[im_end] is None and table.kinds[im_end] is TokenKind.SPECIAL
    assert table.token_bytes[tool_call] == b"<tool_call>" and table.kinds[tool_call] is TokenKind.ADDED_TEXT
    # The GGUF's 271 padding placeholders are gone: the table ends where the real vocabulary ends,
    # narrower than the model's 151,936 logit rows.
    assert len(table) == 151665


def test_tables_are_built_once_per_tokenizer(load_tokenizer) -> None:
    tokenizer = load_tokenizer("gemma-3-270m")
    assert token_table(tokenizer) is token_table(tokenizer)
