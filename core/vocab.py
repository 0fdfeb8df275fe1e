"""What each token id stands for, as bytes, whatever the tokenizer family.

Members with different tokenizers can only agree on TEXT, so every token must be turned into
the exact bytes it spells:

* byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM2, DeepSeek): token strings are bytes written
  through GPT-2's byte-to-unicode table (`Ġ` is a space, `Ċ` a newline); we invert the table.
* SentencePiece-style (Llama-2, Mistral, Gemma): `▁` is a space and `<0xNN>` is the byte NN
  (byte fallback); everything else is UTF-8 text.
* tokenizers whose vocabulary keys are already `bytes` (tiktoken-style) are taken as they are.

Added tokens that are not special (Qwen's `<tool_call>`) stand for their literal text;
special and control tokens (`<|im_end|>`, `<bos>`, `<unk>`) stand for no text and map to
None.

Property (tested on GPT-2, Mistral, Qwen3, DeepSeek-V3, Llama-3.2 and the packaged models):
for a text without special tokens, joining the bytes of `tokenizer.encode(text)` gives
`text.encode()`. Two documented differences come from the tokenizer, not from us: a
SentencePiece "dummy prefix" adds one leading space (`TokenTable.adds_dummy_prefix`), and a
tokenizer with a Unicode normaliser (Qwen's NFC) spells the normalised text.
"""

from __future__ import annotations

import enum
import json
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPIECE_SPACE = "\u2581"


class TokenKind(enum.IntEnum):
    """What a token id is: ordinary text, an added token spelling its literal text, or control."""

    TEXT = 0
    ADDED_TEXT = 1
    SPECIAL = 2


class Scheme(enum.Enum):
    """How a tokenizer writes bytes into its token strings."""

    BYTE_LEVEL = "byte_level"
    SENTENCEPIECE = "sentencepiece"
    PLAIN = "plain"


@dataclass(frozen=True)
class TokenTable:
    """Bytes and kind for every token id of one tokenizer.

    Attributes:
        token_bytes: per id, the bytes it spells, or None for special/control tokens and for
            ids the tokenizer does not define. Length: largest id + 1 (NOT the logits width,
            which may be larger, as Qwen's padded 151,936-row head is).
        kinds: per id, a `TokenKind`.
        scheme: how the vocabulary encodes bytes.
        adds_dummy_prefix: encoding "a" spells " a" (SentencePiece's dummy-prefix space).
        byte_tokens: per byte value 0..255, the id of a token spelling exactly that one byte,
            or None; it lets any byte string be represented exactly, token by token.
    """

    token_bytes: list[bytes | None]
    kinds: list[TokenKind]
    scheme: Scheme
    adds_dummy_prefix: bool
    byte_tokens: list[int | None]

    def __len__(self) -> int:
        return len(self.token_bytes)

    def spell(self, ids: list[int]) -> bytes:
        """The bytes a sequence of ids spells; special tokens spell nothing."""
        return b"".join(self.token_bytes[i] or b"" for i in ids if 0 <= i < len(self.token_bytes))


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the rest
    (controls, space, 0x7F-0xA0, 0xAD) to code points from 256 upward, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + shifted)] = b
            shifted += 1
    return mapping


def _component_types(component: Any) -> set[str]:
    """All `type` names inside a tokenizers component (normaliser, pre-tokeniser, decoder)."""
    if component is None:
        return set()
    state = json.loads(component.__getstate__())
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(state)
    return found


def _detect_scheme(tokenizer: Any, pieces: list[Any]) -> Scheme:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        types = _component_types(backend.pre_tokenizer) | _component_types(backend.decoder)
        if "ByteLevel" in types:
            return Scheme.BYTE_LEVEL
        if types & {"Metaspace", "ByteFallback"} or "Replace" in types:
            return Scheme.SENTENCEPIECE
    # A tokenizer without a tokenizers backend: judge by its vocabulary.
    strings = [p for p in pieces if isinstance(p, str)]
    if sum(p.startswith(_SPIECE_SPACE) for p in strings) > len(strings) // 20:
        return Scheme.SENTENCEPIECE
    if sum(p.startswith("Ġ") for p in strings) > len(strings) // 20:
        return Scheme.BYTE_LEVEL
    return Scheme.PLAIN


def _piece_bytes(piece: Any, scheme: Scheme) -> bytes | None:
    if piece is None:
        return None
    if isinstance(piece, bytes):
        return piece
    if scheme is Scheme.BYTE_LEVEL:
        table = _unicode_to_byte()
        if all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
        return piece.encode("utf-8")
    if scheme is Scheme.SENTENCEPIECE:
        match = _BYTE_TOKEN.match(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return piece.replace(_SPIECE_SPACE, " ").encode("utf-8")
    return piece.encode("utf-8")


def _vocab_size(tokenizer: Any) -> int:
    vocab = tokenizer.get_vocab()
    return max(max(vocab.values(), default=-1) + 1, len(tokenizer))


def _special_and_added(tokenizer: Any) -> tuple[set[int], dict[int, str]]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added_text: dict[int, str] = {}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            special.add(token_id)
        else:
            added_text[token_id] = str(added.content)
    return special, added_text


def _build_table(tokenizer: Any) -> TokenTable:
    size = _vocab_size(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    scheme = _detect_scheme(tokenizer, pieces)
    special, added_text = _special_and_added(tokenizer)
    spelled: list[bytes | None] = []
    kinds: list[TokenKind] = []
    for token_id, piece in enumerate(pieces):
        if token_id in special:
            spelled.append(None)
            kinds.append(TokenKind.SPECIAL)
        elif token_id in added_text:
            spelled.append(added_text[token_id].encode("utf-8"))
            kinds.append(TokenKind.ADDED_TEXT)
        else:
            spelled.append(_piece_bytes(piece, scheme))
            kinds.append(TokenKind.TEXT if spelled[-1] is not None else TokenKind.SPECIAL)
    byte_tokens: list[int | None] = [None] * 256
    for token_id in range(len(spelled) - 1, -1, -1):  # lowest id wins: the base vocabulary's byte token
        value = spelled[token_id]
        if value is not None and len(value) == 1 and kinds[token_id] is TokenKind.TEXT:
            byte_tokens[value[0]] = token_id
    probe = tokenizer.encode("a", add_special_tokens=False)
    adds_prefix = b"".join(spelled[i] or b"" for i in probe) == b" a"
    return TokenTable(spelled, kinds, scheme, adds_prefix, byte_tokens)


_TABLES: weakref.WeakKeyDictionary[Any, TokenTable] = weakref.WeakKeyDictionary()


def token_table(tokenizer: Any) -> TokenTable:
    """The `TokenTable` of a Hugging Face tokenizer, built once per tokenizer object."""
    table = _TABLES.get(tokenizer)
    if table is None:
        table = _build_table(tokenizer)
        _TABLES[tokenizer] = table
    return table


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """The bytes each token id stands for; None for special/control tokens.

    Example:
        >>> from transformers import AutoTokenizer  # doctest: +SKIP
        >>> tok = AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))  # doctest: +SKIP
        >>> b"".join(token_bytes(tok)[i] for i in tok.encode("héllo wörld"))  # doctest: +SKIP
        b'h\\xc3\\xa9llo w\\xc3\\xb6rld'
    """
    return token_table(tokenizer).token_bytes
