"""What each token id stands for, as bytes, whatever the tokenizer family.

Members with different tokenizers can only agree on TEXT, so every token must be turned into
the exact bytes it spells:

* byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM2, DeepSeek): token strings are bytes written
  through GPT-2's byte-to-unicode table (`Ġ` is a space, `Ċ` a newline); we invert the table.
* SentencePiece-style (Llama-2, Mistral, Gemma): `▁` is a space and `<0xNN>` is the byte NN
  (byte fallback); everything else is UTF-8 text.
* tokenizers whose vocabulary keys are already `bytes` (tiktoken-style) are taken as they are.

Added tokens that are not special stand for the text the tokenizer's DECODER gives them, not
for their stored content: Qwen's `<tool_call>` is `<tool_call>`, but Gemma-2/3's added `▁▁▁▁`
is four spaces (their added tokens are vocabulary pieces, written with `▁`). Special and control
tokens (`<|im_end|>`, `<bos>`, `<unk>`) stand for no text and map to None.

Property (tested on GPT-2, Mistral-7B, Qwen3, DeepSeek-V3, Llama-3/3.2, Gemma-2/3, Mistral-Nemo
and the packaged models): for a text without special tokens, joining the bytes of
`tokenizer.encode(text)` gives `text.encode()`. Two documented differences come from the tokenizer, not from us: a
SentencePiece "dummy prefix" adds one leading space (`TokenTable.adds_dummy_prefix`), and a
tokenizer with a Unicode normaliser (Qwen's NFC) spells the normalised text.
"""

from __future__ import annotations

import bisect
import enum
import json
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache, wraps
from typing import Any, TypeVar

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


def prefix_bounds(ordered: list[bytes], prefix: bytes, lo: int = 0) -> tuple[int, int]:
    """[lo, hi): the items of `ordered` (byte strings in byte order) that start with `prefix`.

    They are contiguous: they end before the smallest byte string that is greater than every
    extension (the prefix without its trailing 0xff bytes, last byte plus one).
    """
    lo = bisect.bisect_left(ordered, prefix, lo=lo)
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return lo, len(ordered)
    return lo, bisect.bisect_left(ordered, stripped[:-1] + bytes([stripped[-1] + 1]), lo=lo)


@dataclass(frozen=True)
class SuffixTable:
    """Tokens' bytes past a fixed number of leading bytes (`TokenTable.suffixes`).

    Attributes:
        ids: int64 array [len(table)] (host data): per token id, the index of its suffix text
            (-1: nothing left, or a special token).
        texts: the distinct suffix texts.
    """

    ids: Any
    texts: list[bytes]

    @cached_property
    def position(self) -> dict[bytes, int]:
        """Suffix text -> its index in `texts`."""
        return {text: k for k, text in enumerate(self.texts)}


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

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, tuple[int, ...]]:
        """Text bytes -> the ids spelling exactly them (special tokens excluded), lowest first."""
        found: dict[bytes, list[int]] = {}
        for token_id, spelled in enumerate(self.token_bytes):
            if spelled:
                found.setdefault(spelled, []).append(token_id)
        return {text: tuple(ids) for text, ids in found.items()}

    @cached_property
    def text_index(self) -> tuple[Any, list[bytes], dict[bytes, int]]:
        """(LongTensor [len]: per id, the index of its text among the distinct texts, -1 for
        special tokens; the distinct texts; text -> index). Ids with the same bytes share one."""
        import torch

        texts = list(self.ids_by_bytes)
        position = {text: k for k, text in enumerate(texts)}
        index = [position[b] if b else -1 for b in self.token_bytes]
        return torch.tensor(index, dtype=torch.long), texts, position

    @cached_property
    def text_order(self) -> tuple[list[bytes], Any, Any]:
        """(the distinct texts in byte order; per rank, where its ids start in the next array;
        every id with text, ordered by its text's rank then by id), as host data: a prefix of
        bytes selects one contiguous run of ranks, so one run of ids."""
        import numpy as np

        index, texts, _ = self.text_index
        order = sorted(range(len(texts)), key=texts.__getitem__)
        rank = np.empty(len(texts), dtype=np.int64)
        rank[order] = np.arange(len(texts))
        per_id = index.numpy()
        ids = np.flatnonzero(per_id >= 0)
        id_ranks = rank[per_id[ids]]
        ordered_ids = ids[np.lexsort((ids, id_ranks))]
        starts = np.searchsorted(np.sort(id_ranks), np.arange(len(texts) + 1))
        return [texts[k] for k in order], starts, ordered_ids

    def ids_starting_with(self, prefix: bytes) -> Any:
        """int64 array (host data): the ids whose bytes start with `prefix`, in id order (special
        tokens excluded): what a member's candidates spelling `prefix` and more are, found with
        two binary searches, without a pass over the vocabulary."""
        import numpy as np

        ordered, starts, ids = self.text_order
        lo, hi = prefix_bounds(ordered, prefix)
        return np.sort(ids[starts[lo] : starts[hi]])

    def suffixes(self, skip: int) -> SuffixTable:
        """Every token's bytes past its first `skip` (a prompt-boundary candidate re-covering
        `skip` committed bytes adds exactly these), numbered as distinct texts; built once per
        `skip` and kept, so a step maps thousands of candidates with one array lookup."""
        cache = self.__dict__.setdefault("_suffixes", {})
        if skip not in cache:
            import numpy as np

            lengths = self.__dict__.get("_lengths")
            if lengths is None:
                lengths = self.__dict__["_lengths"] = np.asarray([len(b or b"") for b in self.token_bytes])
            texts: list[bytes] = []
            position: dict[bytes, int] = {}
            index = np.full(len(self.token_bytes), -1, dtype=np.int64)
            longer = np.flatnonzero(lengths > skip).tolist()  # few tokens are long: cheap for large skips
            found = []
            for token in longer:
                rest = self.token_bytes[token][skip:]  # type: ignore[index]
                at = position.setdefault(rest, len(texts))
                if at == len(texts):
                    texts.append(rest)
                found.append(at)
            if longer:
                index[longer] = found
            cache[skip] = SuffixTable(index, texts)
        return cache[skip]

    def suffix_positions(self, skip: int) -> Any:
        """int64 array [len(suffixes(skip).texts)]: per suffix text, its index among the table's
        own distinct texts (`text_index`), or -1 where no whole token spells it."""
        cache = self.__dict__.setdefault("_suffix_positions", {})
        if skip not in cache:
            import numpy as np

            _, _, position = self.text_index
            texts = self.suffixes(skip).texts
            cache[skip] = np.asarray([position.get(text, -1) for text in texts], dtype=np.int64)
        return cache[skip]

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


_ANCHOR = "a"  # a piece every decoder family writes as itself: ASCII, printable, no marker


def _anchored_decoder(tokenizer: Any) -> Callable[[str], str] | None:
    """A function giving the text the tokenizer's decoder writes for one piece, or None.

    A piece is decoded between two anchors, whose own decoding is then cut off: decoding a
    piece alone is wrong where the decoder edits the ends of the WHOLE text (Llama-2/Mistral's
    `Strip` decoder drops one leading space, so `▁▁▁▁` alone decodes to three spaces; the
    SentencePiece backend strips both ends). None when the tokenizer has no decoder that simply
    joins pieces (no `convert_tokens_to_string`, or one that puts text between pieces, as a
    tokenizer without a decoder does): added tokens then spell their literal content.
    """
    convert = getattr(tokenizer, "convert_tokens_to_string", None)
    if convert is None:
        return None
    edge = convert([_ANCHOR])
    if not edge or convert([_ANCHOR, _ANCHOR]) != edge * 2:
        return None

    def decode(piece: str) -> str:
        text = convert([_ANCHOR, piece, _ANCHOR])
        if len(text) < 2 * len(edge) or not (text.startswith(edge) and text.endswith(edge)):
            return piece  # the decoder merged the piece into an anchor: no clean cut exists
        text = text[len(edge) : len(text) - len(edge)]
        # A byte-level piece that is not whole UTF-8 decodes to U+FFFD: its literal text is
        # what the tokenizer matched, so it is the better spelling.
        return piece if text.count("\ufffd") > piece.count("\ufffd") else text

    return decode


def _special_and_added(tokenizer: Any) -> tuple[set[int], dict[int, bytes]]:
    """Ids of special tokens, and the bytes each non-special added token spells.

    Every entry of `added_tokens_decoder` counts, whatever its `normalized` flag: the flag only
    says whether the token is matched before or after normalisation, while the ids the
    tokenizer emits, and what they decode to, are the same either way.
    """
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added_text: dict[int, bytes] = {}
    decode = _anchored_decoder(tokenizer)
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            special.add(token_id)
        else:
            content = str(added.content)
            added_text[token_id] = (decode(content) if decode else content).encode("utf-8")
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
            spelled.append(added_text[token_id])
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


_Built = TypeVar("_Built")


def per_tokenizer(build: Callable[..., _Built]) -> Callable[..., _Built]:
    """`build(tokenizer, *more)`, run once per tokenizer object and forgotten with it: what is
    built from a vocabulary is costly (up to a second for 262k tokens) and the same for every
    member and session sharing that tokenizer. `more` must follow from the tokenizer (it is
    used on the first call only)."""
    built: weakref.WeakKeyDictionary[Any, _Built] = weakref.WeakKeyDictionary()

    @wraps(build)
    def once(tokenizer: Any, *more: Any) -> _Built:
        found = built.get(tokenizer)
        if found is None:
            found = build(tokenizer, *more)
            built[tokenizer] = found
        return found

    return once


@per_tokenizer
def token_table(tokenizer: Any) -> TokenTable:
    """The `TokenTable` of a Hugging Face tokenizer, built once per tokenizer object."""
    return _build_table(tokenizer)


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """The bytes each token id stands for; None for special/control tokens.

    Example:
        >>> from transformers import AutoTokenizer  # doctest: +SKIP
        >>> tok = AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))  # doctest: +SKIP
        >>> b"".join(token_bytes(tok)[i] for i in tok.encode("héllo wörld"))  # doctest: +SKIP
        b'h\\xc3\\xa9llo w\\xc3\\xb6rld'
    """
    return token_table(tokenizer).token_bytes
