"""Keeping a member's token ids in step with the committed text (ALGORITHMS.md section 6).

The shared state of a generation is TEXT, as bytes. Whenever text is committed, each member
must hold token ids that spell exactly the prompt plus that text. Re-encoding everything
each step would cost a full prefill; instead a member re-encodes only a short tail (its last
few generated tokens' bytes plus the new bytes), keeps the longest common prefix with the
ids it already has (and their KV cache), and appends the rest.

Bytes that end in an incomplete UTF-8 character are held back until the character is whole:
tokenizers encode strings, and a split character would tokenize differently once complete.
The member that produced the committed token keeps its own id without any re-encoding, so
an ensemble that always follows one member reproduces that member exactly, split characters
included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ensemble_core.members.kv_batch import KVBatch
from ensemble_core.vocab import TokenTable

DEFAULT_TAIL_TOKENS = 4
_ANCHORS = ("\n", "\n\n", ".", "a")


def incomplete_utf8_suffix(data: bytes) -> int:
    """How many trailing bytes form the start of a UTF-8 character that is not yet complete.

    Only a valid lead byte followed by too few continuation bytes counts; bytes that can
    never become valid UTF-8 are not held back (they are passed on as byte tokens).
    """
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back if needed > back else 0
    return 0


class ExactEncoder:
    """Encodes bytes into token ids that spell exactly those bytes.

    Tries, in order: the tokenizer's own encoding; the same behind an anchor string whose ids
    are then dropped (this removes a SentencePiece dummy-prefix space); one byte token per byte
    (always exact, not canonical). Every result is checked against the bytes, so a Unicode
    normaliser or a literal special-token string in the text can never slip through.
    """

    def __init__(self, tokenizer: Any, table: TokenTable):
        self._tokenizer = tokenizer
        self._table = table
        self._anchors = [(a, self._plain(a)) for a in _ANCHORS] if table.adds_dummy_prefix else []
        self.fallbacks = 0  # encodings that had to use byte tokens (or were lossy)

    def _plain(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode(self, data: bytes) -> list[int]:
        """Ids spelling exactly `data` (empty bytes give no ids)."""
        if not data:
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._byte_tokens(data)
        ids = self._plain(text)
        if self._table.spell(ids) == data and self._no_special(ids):
            return ids
        for anchor, anchor_ids in self._anchors:
            ids = self._plain(anchor + text)
            rest = ids[len(anchor_ids) :]
            if ids[: len(anchor_ids)] == anchor_ids and self._table.spell(rest) == data and self._no_special(rest):
                return rest
        return self._byte_tokens(data)

    def _no_special(self, ids: list[int]) -> bool:
        return all(self._table.token_bytes[i] is not None for i in ids if i < len(self._table))

    def _byte_tokens(self, data: bytes) -> list[int]:
        self.fallbacks += 1
        ids = [self._table.byte_tokens[b] for b in data]
        if all(i is not None for i in ids):
            return [i for i in ids if i is not None]
        # The vocabulary cannot spell some byte (e.g. SmolLM2 has no token for 0x04): the
        # tokenizer's own (lossy) encoding is the closest this member can get.
        return self._plain(data.decode("utf-8", errors="replace"))


@dataclass
class _RowText:
    prompt_length: int
    spelled: bytes = b""  # what the generated ids spell
    held: bytes = b""  # committed bytes not yet tokenised (an incomplete character)


@dataclass
class SyncStats:
    """How a member kept up with committed text: kept own ids vs re-encoded tail tokens."""

    own_tokens: int = 0
    reencoded_tokens: int = 0
    rollbacks: int = 0
    byte_fallbacks: int = 0


class MemberSession:
    """One member's view of a batched generation: its `KVBatch` plus each row's text.

    Args:
        batch: the member's cache and token ids (prompts already placed).
        table: the member's `TokenTable`.
        encoder: its `ExactEncoder`.
        tail_tokens: how many of its last generated tokens are re-encoded with new text.
    """

    def __init__(
        self, batch: KVBatch, table: TokenTable, encoder: ExactEncoder, tail_tokens: int = DEFAULT_TAIL_TOKENS
    ):
        self.batch = batch
        self._table = table
        self._encoder = encoder
        self._tail = tail_tokens
        self._rows = [_RowText(prompt_length=batch.length(r)) for r in range(batch.batch_size)]
        self._counts = SyncStats()

    def next_logits(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Next-token logits after each row's committed text (catching up in one forward)."""
        return self.batch.next_logits(rows)

    def generated_ids(self, row: int) -> list[int]:
        return self.batch.ids(row)[self._rows[row].prompt_length :]

    def spelled(self, row: int) -> bytes:
        """Committed text this member has tokenised (the rest is held back)."""
        return self._rows[row].spelled

    def select_rows(self, rows: Sequence[int]) -> None:
        self.batch.select_rows(rows)
        self._rows = [self._rows[r] for r in rows]

    def commit(self, row: int, data: bytes, own_token: int | None = None) -> None:
        """Bring the row in step with `data` appended to the committed text.

        Args:
            own_token: the id this member itself proposed for exactly `data`; it is kept as
                is (no re-encoding), so following one member reproduces it exactly.
        """
        state = self._rows[row]
        if own_token is not None and not state.held and (self._table.token_bytes[own_token] or b"") == data:
            # Also the path for a special token the member chose that spells nothing: it is
            # kept, as `generate` would keep it.
            self.batch.extend(row, [own_token])
            state.spelled += data
            self._counts.own_tokens += 1
            return
        if not data:
            return
        full = state.spelled + state.held + data
        hold = incomplete_utf8_suffix(full)
        target = full[: len(full) - hold]
        state.held = full[len(target) :]
        if target != state.spelled:
            self._retokenise_tail(row, target)

    def _retokenise_tail(self, row: int, target: bytes) -> None:
        state = self._rows[row]
        generated = self.generated_ids(row)
        start, start_byte = self._tail_start(generated, len(state.spelled), target)
        fallbacks_before = self._encoder.fallbacks
        fresh = self._encoder.encode(target[start_byte:])
        self._counts.byte_fallbacks += self._encoder.fallbacks - fallbacks_before
        old = generated[start:]
        common = 0
        while common < min(len(old), len(fresh)) and old[common] == fresh[common]:
            common += 1
        if common < len(old):
            self._counts.rollbacks += 1
            self.batch.truncate(row, state.prompt_length + start + common)
        self.batch.extend(row, fresh[common:])
        self._counts.reencoded_tokens += len(fresh) - common
        state.spelled = target

    def _tail_start(self, generated: list[int], spelled_length: int, target: bytes) -> tuple[int, int]:
        """The token index where re-encoding starts, and its byte offset.

        It lies `tail_tokens` back, or earlier where needed so that it starts on a whole
        character and inside `target` (the text the ids must spell afterwards). Walking back
        from the end keeps a commit O(tail), not O(generated text).
        """
        start, offset = len(generated), spelled_length
        while start > 0 and (
            len(generated) - start < self._tail or offset > len(target) or _is_continuation(target, offset)
        ):
            start -= 1
            offset -= len(self._table.token_bytes[generated[start]] or b"")
        return start, offset

    def stats(self) -> SyncStats:
        """Totals over the whole batch since the session started."""
        return SyncStats(
            own_tokens=self._counts.own_tokens,
            reencoded_tokens=self._counts.reencoded_tokens,
            rollbacks=self._counts.rollbacks,
            byte_fallbacks=self._counts.byte_fallbacks,
        )


def _is_continuation(data: bytes, offset: int) -> bool:
    return offset < len(data) and data[offset] & 0xC0 == 0x80
