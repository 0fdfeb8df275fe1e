"""A constraint's state over one request's committed bytes, and which union entries it allows.

One llguidance matcher per request, over a "tokenizer" whose tokens are the union vocabulary's
entries (texts) followed by the 256 single bytes: the union's texts let llguidance compute the
allowed set of a whole step in one bitmask (its token trie, about a millisecond for 300k
entries), and the single bytes let any committed text be fed, whatever member spelled it and
however. Entry 0 is the end of text (the union's EOS entry), allowed only where the grammar may
end. The tokenizer is built once per union (a few seconds for 300k entries) and shared.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from ensemble_core.constraints.kinds import Constraint
from ensemble_core.errors import GenerationError
from ensemble_core.vocab.tokens import prefix_bounds

_TOKENIZERS: dict[int, Any] = {}  # id(union) -> its tokenizer, dropped when the union goes
_LOCK = threading.Lock()


class _EntryTexts:
    """What llguidance's `TokenizerWrapper` reads: every union entry's bytes, then the bytes."""

    def __init__(self, entries: list[bytes]) -> None:
        self.tokens = list(entries) + [bytes([b]) for b in range(256)]
        self.eos_token_id = 0  # the union's end-of-sequence entry
        self.bos_token_id = None
        self.special_token_ids = [0] + [k for k, text in enumerate(entries) if not text and k]

    def __call__(self, text: str | bytes) -> list[int]:
        data = text if isinstance(text, bytes) else text.encode()
        return [len(self.tokens) - 256 + b for b in data]


def grammar_tokenizer(union: Any) -> Any:
    """The llguidance tokenizer of a union (built once per union, kept while the union lives)."""
    with _LOCK:
        found = _TOKENIZERS.get(id(union))
        if found is None:
            from llguidance import LLTokenizer, TokenizerWrapper

            found = LLTokenizer(TokenizerWrapper(_EntryTexts(list(union.entries))))
            _TOKENIZERS[id(union)] = found
            weakref.finalize(union, _TOKENIZERS.pop, id(union), None)
        return found


class ConstraintState:
    """One request's matcher: which texts may come next, and what has been committed."""

    def __init__(self, constraint: Constraint, union: Any) -> None:
        from llguidance import LLMatcher

        self.constraint = constraint
        self.union = union
        self.union_size = union.size
        self._byte_base = union.size
        self._matcher = LLMatcher(grammar_tokenizer(union), constraint.grammar(), log_level=0)
        if self._matcher.is_error():
            raise GenerationError(f"The {constraint.describe()} could not start: {self._matcher.get_error()}")
        self._mask: np.ndarray | None = None
        self.committed = bytearray()  # what the reply holds so far (for error messages)

    def after(self, text: bytes) -> ConstraintState:
        """This state as it will be once `text` is committed, this one unchanged (SAFE decides
        the positions of a draft before any of it is committed)."""
        if not text:
            return self
        view = object.__new__(ConstraintState)
        view.__dict__.update(self.__dict__)
        view._matcher = self._matcher.deep_copy()
        view._mask = None
        view.committed = bytearray(self.committed)
        view.advance(text)
        return view

    def _bytes(self, text: bytes) -> list[int]:
        return [self._byte_base + b for b in text]

    def allows(self, text: bytes) -> bool:
        """Whether `text` may come next (the empty text never: it commits nothing)."""
        return bool(text) and self._matcher.validate_tokens(self._bytes(text)) == len(text)

    def allows_end(self) -> bool:
        """Whether the reply may end here."""
        return self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """Nothing more may be written: the reply is complete."""
        return self._matcher.is_stopped()

    def allowed_entries(self) -> np.ndarray:
        """bool [union size]: the union entries whose whole text may come next (entry 0: the
        end), computed once per committed state.

        Where the grammar forces the next bytes (`{"name": "` of a schema), llguidance's mask
        allows only its own reading of them; every entry that spells a prefix of those bytes, or
        all of them and more, is as good, so those are added (the longer ones checked)."""
        if self._mask is None:
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            mask = np.unpackbits(bits, bitorder="little")[: self.union_size].astype(bool)
            forced = self._matcher.compute_ff_bytes()
            if forced:
                entries = self.union.entries
                for end in range(1, len(forced) + 1):
                    found = self.union.index_of(forced[:end])
                    if found is not None:
                        mask[found] = True
                lo, hi = prefix_bounds(entries, forced, lo=1)
                for entry in range(lo, hi):
                    mask[entry] = mask[entry] or self.allows(entries[entry])
            mask[0] = self.allows_end()
            self._mask = mask
        return self._mask

    def forced(self) -> bytes:
        """The bytes the grammar allows as the only way on (`{"name": "` of a schema whose first
        key is a string; a forced call's opening): committed at once, without a decision."""
        return self._matcher.compute_ff_bytes()

    def advance(self, text: bytes) -> None:
        """Commit `text` (the method chose an allowed text; anything else is a bug, said loudly)."""
        if not text:
            return
        self._mask = None
        self.committed += text
        if not self._matcher.consume_tokens(self._bytes(text)):
            raise GenerationError(
                f"Committed text {text!r} breaks the {self.constraint.describe()}: "
                f"{self._matcher.get_error() or 'rejected by the grammar'}"
            )
