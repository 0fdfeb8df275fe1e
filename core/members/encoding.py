"""Token ids that spell given bytes EXACTLY, or a clear "cannot".

A member may only continue from text it really has. Tokenizers do not always give it back:
a SentencePiece dummy prefix adds a space, a Unicode normaliser (NFC, NFKC, lowercasing)
changes the text, a vocabulary may lack a byte (SmolLM2 has no token for 0x04), and a literal
`<|im_end|>` in the text would become a control token. So every encoding is checked against the
bytes it must spell, and when none spells them the answer is None: the member then sits out
instead of continuing from a different text.
"""

from __future__ import annotations

from typing import Any

from ensemble_core.vocab.tokens import TokenTable
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

_ANCHORS = ("\n", "\n\n", ".", "a")


class ExactEncoder:
    """Encodes bytes into token ids that spell exactly those bytes.

    Tries, in order: the tokenizer's own encoding; the same behind an anchor string whose ids
    are then dropped (this removes a SentencePiece dummy-prefix space); one byte token per byte
    (always exact where the vocabulary has them, not canonical).
    """

    def __init__(self, tokenizer: Any, table: TokenTable):
        self._tokenizer = tokenizer
        self._table = table
        self._anchors = [(a, self._plain(a)) for a in _ANCHORS] if table.adds_dummy_prefix else []
        self.fallbacks = 0  # encodings that had to use byte tokens

    def _plain(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode(self, data: bytes) -> list[int] | None:
        """Ids spelling exactly `data` (empty bytes give no ids), or None if none do."""
        if not data:
            return []
        partial = incomplete_utf8_suffix(data)
        if partial:  # a character still being written: whole text normally, its first bytes as byte tokens
            head = self.encode(data[:-partial])
            tail = self.byte_tokens(data[-partial:])
            return None if head is None or tail is None else head + tail
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._counted_byte_tokens(data)
        ids = self._plain(text)
        if self._spells(ids, data):
            return ids
        for anchor, anchor_ids in self._anchors:
            ids = self._plain(anchor + text)
            rest = ids[len(anchor_ids) :]
            if ids[: len(anchor_ids)] == anchor_ids and self._spells(rest, data):
                return rest
        return self._counted_byte_tokens(data)

    def canonical(self, text: bytes) -> list[int] | None:
        """The tokenizer's own ids for `text` (no fallbacks), or None when they do not spell it."""
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
        ids = self._plain(decoded)
        if self._spells(ids, text):
            return ids
        for anchor, anchor_ids in self._anchors:
            ids = self._plain(anchor + decoded)
            rest = ids[len(anchor_ids) :]
            if ids[: len(anchor_ids)] == anchor_ids and self._spells(rest, text):
                return rest
        return None

    def _spells(self, ids: list[int], data: bytes) -> bool:
        table = self._table
        return all(0 <= i < len(table) and table.token_bytes[i] is not None for i in ids) and table.spell(ids) == data

    def can_spell_bytes(self, data: bytes) -> bool:
        """Whether every byte of `data` has a single-byte token (byte-level BPE, byte fallback)."""
        return all(self._table.byte_tokens[b] is not None for b in data)

    def byte_tokens(self, data: bytes) -> list[int] | None:
        """One byte token per byte, or None when the vocabulary lacks one of them."""
        ids = [self._table.byte_tokens[b] for b in data]
        return None if any(i is None for i in ids) else [i for i in ids if i is not None]

    def _counted_byte_tokens(self, data: bytes) -> list[int] | None:
        ids = self.byte_tokens(data)
        if ids is not None:
            self.fallbacks += 1
        return ids
