"""Keeping a member's token ids in step with the committed text (ALGORITHMS.md section 6).

The shared state of a generation is TEXT, as bytes. Whenever text is committed, each member
must hold token ids that spell exactly the prompt plus that text. Re-encoding everything
each step would cost a full prefill; instead a member re-encodes only a short tail (its last
few generated tokens' bytes plus the new bytes), keeps the longest common prefix with the
ids it already has (and their KV cache), and appends the rest.

Committed text may end inside a UTF-8 character (byte-level tokens can split one). A member
whose vocabulary has single-byte tokens (byte-level BPE, SentencePiece byte fallback) spells
the incomplete character with them, so it stays exactly in step at every byte; when the
character completes, the tail re-encoding replaces them with the canonical token. A member
that cannot spell those bytes holds them back until the character is whole (`held`); methods
leave such a member out of the steps where it is behind.
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
        partial = incomplete_utf8_suffix(data)
        if partial:  # a character still being written: whole text normally, its first bytes as byte tokens
            return self.encode(data[:-partial]) + self._byte_tokens(data[-partial:], count=False)
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

    def can_spell_bytes(self, data: bytes) -> bool:
        """Whether every byte of `data` has a single-byte token (byte-level BPE, byte fallback)."""
        return all(self._table.byte_tokens[b] is not None for b in data)

    def _byte_tokens(self, data: bytes, count: bool = True) -> list[int]:
        self.fallbacks += count
        ids = [self._table.byte_tokens[b] for b in data]
        if all(i is not None for i in ids):
            return [i for i in ids if i is not None]
        # The vocabulary cannot spell some byte (e.g. SmolLM2 has no token for 0x04): the
        # tokenizer's own (lossy) encoding is the closest this member can get.
        return self._plain(data.decode("utf-8", errors="replace"))


@dataclass
class _RowText:
    prompt_length: int
    synced: int = 0  # generated ids that spell `spelled`; any ids after them are speculative
    spelled: bytes = b""  # what the synced generated ids spell
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

    A row's ids are the prompt, then the "synced" ids that spell the committed text (minus
    held-back bytes), then optionally speculative ids (a draft, or a verifier's reading of
    one) that the next `commit` either keeps, where they agree with what is committed, or
    drops.

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
        self.table = table
        self.encoder = encoder
        self._tail = tail_tokens
        self._rows = [_RowText(prompt_length=batch.length(r)) for r in range(batch.batch_size)]
        self._counts = SyncStats()

    def next_logits(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Next-token logits after each row's current ids (catching up in one forward)."""
        return self.batch.next_logits(rows)

    def generated_ids(self, row: int) -> list[int]:
        """The row's ids for the committed text (speculative ids excluded)."""
        state = self._rows[row]
        return self.batch.ids(row)[state.prompt_length : state.prompt_length + state.synced]

    def synced_length(self, row: int) -> int:
        """Prompt plus synced generated ids: where speculative ids would start."""
        state = self._rows[row]
        return state.prompt_length + state.synced

    def committed_tail(self, row: int, size: int) -> bytes:
        """The last `size` or more bytes of the row's committed text (what stop strings need)."""
        state = self._rows[row]
        return (state.spelled[-size:] if size else b"") + state.held

    def held(self, row: int) -> bytes:
        """Committed bytes this member has not tokenised yet (an incomplete character)."""
        return self._rows[row].held

    def speculate(self, row: int, token_ids: Sequence[int]) -> None:
        """Append ids beyond the committed text (a draft); the next `commit` settles them."""
        self.batch.extend(row, token_ids)

    def select_rows(self, rows: Sequence[int]) -> None:
        self.batch.select_rows(rows)
        self._rows = [self._rows[r] for r in rows]

    def commit(self, row: int, data: bytes, own_tokens: Sequence[int] = ()) -> None:
        """Bring the row in step with `data` appended to the committed text.

        Args:
            own_tokens: ids this member itself proposed, spelling a prefix of `data`; they
                are kept as they are (no re-encoding, and speculative ids that match keep
                their cache), so an ensemble that follows one member reproduces it exactly.
                A special token the member chose (spelling nothing) is kept the same way.
        """
        state = self._rows[row]
        own = list(own_tokens)
        own_bytes = self.table.spell(own)
        if own and not state.held and data.startswith(own_bytes):
            self._keep_own(row, own)
            state.spelled += own_bytes
            data = data[len(own_bytes) :]
        if data:
            full = state.spelled + state.held + data
            partial = incomplete_utf8_suffix(full)
            if partial and self.encoder.can_spell_bytes(full[-partial:]):
                partial = 0  # spelled with byte tokens now, re-encoded whole once the character completes
            target = full[: len(full) - partial]
            state.held = full[len(target) :]
            if target != state.spelled:
                self._retokenise_tail(row, target)
        if self.batch.length(row) > self.synced_length(row):  # speculation nobody committed
            self.batch.truncate(row, self.synced_length(row))

    def _keep_own(self, row: int, own: list[int]) -> None:
        state = self._rows[row]
        start = self.synced_length(row)
        if self.batch.ids(row)[start : start + len(own)] != own:
            if self.batch.length(row) > start:
                self.batch.truncate(row, start)
            self.batch.extend(row, own)
        state.synced += len(own)
        self._counts.own_tokens += len(own)

    def _retokenise_tail(self, row: int, target: bytes) -> None:
        state = self._rows[row]
        ids = self.batch.ids(row)
        synced = ids[state.prompt_length : state.prompt_length + state.synced]
        start, start_byte = self._tail_start(synced, len(state.spelled), target)
        fallbacks_before = self.encoder.fallbacks
        fresh = self.encoder.encode(target[start_byte:])
        self._counts.byte_fallbacks += self.encoder.fallbacks - fallbacks_before
        old = ids[state.prompt_length + start :]  # speculative ids included: matching ones keep their cache
        common = 0
        while common < min(len(old), len(fresh)) and old[common] == fresh[common]:
            common += 1
        if common < len(old):
            if common < state.synced - start:
                self._counts.rollbacks += 1
            self.batch.truncate(row, state.prompt_length + start + common)
        self.batch.extend(row, fresh[common:])
        self._counts.reencoded_tokens += len(fresh) - common
        state.synced = start + len(fresh)
        state.spelled = target

    def _tail_start(self, synced: list[int], spelled_length: int, target: bytes) -> tuple[int, int]:
        """The token index where re-encoding starts, and its byte offset.

        It lies `tail_tokens` back, or earlier where needed so that it starts on a whole
        character and inside `target` (the text the ids must spell afterwards). Walking back
        from the end keeps a commit O(tail), not O(generated text).
        """
        start, offset = len(synced), spelled_length
        while start > 0 and (
            len(synced) - start < self._tail or offset > len(target) or _is_continuation(target, offset)
        ):
            start -= 1
            offset -= len(self.table.token_bytes[synced[start]] or b"")
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
