"""The union vocabulary: every member's tokens, normalised to the bytes they spell.

Members with different tokenizers can only add up probabilities over a shared index. The
union's entries are byte strings (from `TokenTable`), sorted, so that all entries starting
with a given text form one contiguous range (what SAFE's sharpening sums over). Entry 0 is
"end of sequence": every end-of-sequence id of every member maps there.

Per member, a `MemberMap` holds an index map, token id -> union entry (NOT a dense matrix):

* ids with the same bytes map to the same entry, so their probabilities add up;
* logit rows past the tokenizer's length (Qwen's padded 151,936-row head) and special tokens
  other than end-of-sequence map to a "nowhere" slot that is ignored;
* probabilities of any dtype are accumulated in float32.

A union is built once per member set and shared while anything uses it, so a second ensemble
over the same loaded members (or a second generation) pays nothing; once no ensemble holds it
(all closed or gone), it is freed. Index maps move to a combining device once and stay there.
"""

from __future__ import annotations

import bisect
import collections
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from ensemble_core.vocab.segments import SegmentPlan
from ensemble_core.vocab.tokens import TokenTable

EOS_INDEX = 0


@dataclass(frozen=True)
class MemberMap:
    """How one member's ids land in the union.

    Attributes:
        to_union: LongTensor [logits width]: union index per id; `nowhere` for ids that are not
            text and not end-of-sequence (and for padded logit rows).
        first_id: LongTensor [union size]: the member's lowest id spelling each entry, or -1.
        extra_ids: union index -> the member's further ids with the same bytes (rare).
        ids_per_entry: the most ids of this member that share one entry (bounds its mass
            on any entry outside its top-k: `ids_per_entry * p_kth`).
    """

    to_union: torch.Tensor
    first_id: torch.Tensor
    extra_ids: dict[int, tuple[int, ...]]
    ids_per_entry: int
    _placed: dict[torch.device, MemberMap] = field(default_factory=dict, compare=False, repr=False)

    def has(self, entry: int) -> bool:
        return 0 <= entry < len(self.first_id) and int(self.host_first_id[entry]) >= 0

    @cached_property
    def host_to_union(self) -> np.ndarray:
        """`to_union` as host data (numpy, sharing the CPU tensor's memory): lookups the host
        makes are not reads of a device tensor."""
        return self.to_union.cpu().numpy()

    @cached_property
    def host_first_id(self) -> np.ndarray:
        """`first_id` as host data (see `host_to_union`)."""
        return self.first_id.cpu().numpy()

    @cached_property
    def plan(self) -> SegmentPlan:
        """How the member's ids add into the union's entries, in a fixed order (`vocab.segments`)."""
        size = len(self.first_id)
        return SegmentPlan.of([e if e < size else -1 for e in self.host_to_union.tolist()], size)

    @cached_property
    def shared_entries(self) -> torch.Tensor:
        """LongTensor (CPU, sorted): the entries `extra_ids` has further ids for."""
        return torch.tensor(sorted(self.extra_ids), dtype=torch.long)

    def on(self, device: torch.device) -> MemberMap:
        """This map with its index tensors on `device` (moved once, then reused)."""
        if self.to_union.device == device:
            return self
        if device not in self._placed:
            self._placed[device] = MemberMap(
                self.to_union.to(device), self.first_id.to(device), self.extra_ids, self.ids_per_entry
            )
        return self._placed[device]


@dataclass(frozen=True)
class UnionVocab:
    """The union of several members' vocabularies.

    Attributes:
        entries: the byte string of each union index (entry 0, end of sequence, is b"").
        maps: one `MemberMap` per member, in member order.
        tables: the members' token tables (kept alive with the union).
    """

    entries: list[bytes]
    maps: list[MemberMap]
    tables: tuple[TokenTable, ...] = ()

    @property
    def size(self) -> int:
        return len(self.entries)

    @property
    def nowhere(self) -> int:
        """The slot unmapped ids accumulate into (one past the last entry; ignored)."""
        return len(self.entries)

    def suffix_entries(self, member: int, skip: int, table: TokenTable) -> np.ndarray:
        """int64 array (host data) over `table.suffixes(skip).texts`: each suffix text's union index,
        or -1 where no member has it as a whole token. Built once per member and `skip`, then kept."""
        cache = self.__dict__.setdefault("_suffix_entries", {})
        key = (member, skip)
        if key not in cache:
            texts = table.suffixes(skip).texts
            cache[key] = np.asarray([-1 if (i := self.index_of(t)) is None else i for t in texts], dtype=np.int64)
        return cache[key]

    def index_of(self, text: bytes) -> int | None:
        """The union index of a byte string, or None if no member has it as one token."""
        found = bisect.bisect_left(self.entries, text, lo=1)
        return found if found < len(self.entries) and self.entries[found] == text else None


def _member_map(table: TokenTable, eos_ids: frozenset[int], width: int, index: dict[bytes, int]) -> MemberMap:
    nowhere = len(index) + 1
    targets = [nowhere] * width
    first = [-1] * (len(index) + 1)
    extra: dict[int, list[int]] = {}
    for token_id in range(min(width, len(table))):
        spelled = table.token_bytes[token_id]
        if token_id in eos_ids:
            entry = EOS_INDEX
        elif spelled:
            entry = index[spelled]
        else:
            continue
        targets[token_id] = entry
        if first[entry] < 0:
            first[entry] = token_id
        else:
            extra.setdefault(entry, []).append(token_id)
    for token_id in eos_ids:  # an EOS id past the table (rare) still ends the sequence
        if len(table) <= token_id < width:
            targets[token_id] = EOS_INDEX
    sharing = 1 + max((len(v) for v in extra.values()), default=0)
    return MemberMap(
        to_union=torch.tensor(targets, dtype=torch.long),
        first_id=torch.tensor(first, dtype=torch.long),
        extra_ids={k: tuple(v) for k, v in extra.items()},
        ids_per_entry=sharing,
    )


_Key = tuple[tuple[int, frozenset[int], int], ...]
_BUILT: dict[_Key, weakref.ref[UnionVocab]] = {}
# The last few unions stay alive after their ensemble is gone (a new Ensemble over the same
# members, as a notebook or a test suite makes, would otherwise rebuild: ~1-2 s for three large
# vocabularies). Bounded, and `forget_union` (Ensemble.close) releases one at once.
_RECENT: collections.OrderedDict[_Key, UnionVocab] = collections.OrderedDict()
RECENT_UNIONS = 4
_BUILDING = threading.Lock()


def build_union(tables: Sequence[TokenTable], eos_ids: Sequence[frozenset[int]], widths: Sequence[int]) -> UnionVocab:
    """The union over members given by their token tables, end-of-sequence ids and logits widths.

    Shared while anything holds it, and the last `RECENT_UNIONS` built are kept for reuse: a
    union keeps its tables alive, so the ids in its key stay valid; when the last holder lets go
    (`forget_union` drops the reuse hold), the entry removes itself.
    """
    key = tuple((id(t), e, w) for t, e, w in zip(tables, eos_ids, widths, strict=True))
    with _BUILDING:
        found = _BUILT.get(key)
        union = found() if found is not None else None
        if union is None:
            union = _build(tables, eos_ids, widths)
            _BUILT[key] = weakref.ref(union, lambda _, key=key: _BUILT.pop(key, None))
        _RECENT[key] = union
        _RECENT.move_to_end(key)
        while len(_RECENT) > RECENT_UNIONS:
            _RECENT.popitem(last=False)
        return union


def forget_union(union: UnionVocab) -> None:
    """Stop keeping `union` alive for reuse (it is freed once nothing else holds it)."""
    with _BUILDING:
        for key in [k for k, kept in _RECENT.items() if kept is union]:
            del _RECENT[key]


def _build(tables: Sequence[TokenTable], eos_ids: Sequence[frozenset[int]], widths: Sequence[int]) -> UnionVocab:
    texts: set[bytes] = set()
    for table in tables:
        texts.update(b for b in table.token_bytes if b)
    entries = [b"", *sorted(texts)]
    index = {text: i for i, text in enumerate(entries) if i}
    maps = [_member_map(t, e, w, index) for t, e, w in zip(tables, eos_ids, widths, strict=True)]
    return UnionVocab(entries, maps, tuple(tables))
