"""Prompt-boundary correction: a member's distribution over continuations of text whose end is
not where its tokenizer would put a token boundary (docs/explanation/prompt-boundary.md; Hayase et al. 2025,
"Sampling from your language model one byte at a time").

Given the member's history (ids it keeps) and the committed bytes S it has not tokenised yet:

1. **Trunk.** S is tokenised canonically as it is, and followed by each of a set of probe
   continuations (a letter, a space, a newline, a digit, an apostrophe, CJK, ... and nothing).
   The tokens all these tokenisations share are the *stable* part: no later byte can change
   them (whitespace runs, newlines, digit groups and contractions are exactly where they
   differ). They join the history; the rest of S is the unstable remainder R (a few bytes).
2. **Paths.** Every tokenisation above also says where token boundaries fall inside R, and with
   which tokens: for each position i of R, the token paths that end exactly at i
   (`"\\n\\n"` is one token at the end of a text but two before "The", so both are paths).
3. **Leaves.** After a path ending at i < |R|, every token the tokenizer can emit whose bytes
   start with R[i:] and go further is a candidate: it adds its bytes past R. After a path
   ending at |R| every token is (the end of text too, "special tokens count only at exact
   boundaries").
4. **Weights.** A candidate's probability is P(path) * p(leaf | path), with P(path) the
   product of the member's own token probabilities along it; all of them normalised by their
   sum (the probability of R itself). All paths form a small trie under the trunk, evaluated in
   the same ONE forward as everything else, and reused while they stay under the trunk.

When S is empty or wholly stable, there is one path (the history's end) and the result is the
member's plain next-token distribution: nothing changes where nothing was wrong.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ensemble_core.members.contract import (
    Candidate,
    CandidateScore,
    Continuations,
    PartialGroup,
    Pick,
    RenderedPrompt,
    ScoreKind,
)
from ensemble_core.members.token_tree import Node
from ensemble_core.sampling import tempered
from ensemble_core.vocab.disk_cache import cached_flags
from ensemble_core.vocab.tokens import TokenKind, TokenTable, per_tokenizer
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

if TYPE_CHECKING:
    from ensemble_core.members.session import Origin, RequestState, TreeSession

# What could follow the committed text, one of each kind of byte that pre-tokenizers and BPE
# merges treat differently (the empty probe is "the text ends here").
PROBES = (
    "",
    "a",
    "A",
    "1",
    "0",
    " a",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    ".",
    ",",
    "'",
    "'s",
    "-",
    "(",
    ")",
    "=",
    "_",
    '"',
    "é",
    "中",
    "🙂",
)


# ---------------------------------------------------------------------- per-tokenizer tables


class LeafIndex:
    """The tokens a tokenizer can emit as text, sorted by their bytes, to find every token that
    starts with given bytes in O(log n)."""

    def __init__(self, tokenizer: Any, table: TokenTable):
        emitted = cached_flags("emittable", tokenizer, table, lambda: _emittable(tokenizer, table))
        pairs = sorted(
            (spelled, token)
            for token, spelled in enumerate(table.token_bytes)
            if spelled and table.kinds[token] is not TokenKind.SPECIAL and emitted[token]
        )
        self._texts = [text for text, _ in pairs]
        self._ids = np.asarray([token for _, token in pairs], dtype=np.int64)
        self._cache: dict[tuple[bytes, int, torch.device], tuple[torch.Tensor, np.ndarray]] = {}

    def longer_than(
        self, prefix: bytes, width: int | None = None, device: torch.device | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Ids of emittable tokens whose bytes start with `prefix` and are longer, below `width` if
        given: on `device` (the CPU by default; found on the host, moved once) and as host data."""
        key = (prefix, width or 0, device or torch.device("cpu"))
        found = self._cache.get(key)
        if found is None:
            lo = bisect.bisect_right(self._texts, prefix)  # past the token equal to `prefix`, if any
            hi = bisect.bisect_left(self._texts, _after_all_extensions(prefix), lo) if prefix else len(self._texts)
            ids = self._ids[lo:hi]
            if width is not None:
                ids = ids[ids < width]
            found = (torch.from_numpy(ids).to(key[2]), ids)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = found
        return found


def _after_all_extensions(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (len(prefix) + 64)
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _emittable(tokenizer: Any, table: TokenTable) -> list[bool]:
    """Per id: the tokenizer can produce it (encoding its own text gives exactly it). Tokens whose
    bytes are not text on their own (pieces of a character) count as emittable."""
    texts: list[str] = []
    owners: list[int] = []
    flags = [True] * len(table)
    for token, spelled in enumerate(table.token_bytes):
        if not spelled or table.kinds[token] is TokenKind.SPECIAL:
            flags[token] = False
            continue
        try:
            texts.append(spelled.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        owners.append(token)
    # One id spelling exactly the token's own text cannot spell it wrongly: the raw ids suffice.
    encoded = _encode_raw(tokenizer, table, texts)
    for token, ids in zip(owners, encoded, strict=True):
        flags[token] = ids is not None and len(ids) == 1 and ids[0] == token
    return flags


class PreTokens:
    """Where a tokenizer's pre-tokenizer splits a text: no token crosses these points, so they are
    the only places a stable trunk may end. Tokenizers whose pre-tokenizer does not split (Gemma's
    SentencePiece, after its normaliser turns spaces into `▁`) get whitespace-led words instead,
    which is where their merges stop in practice."""

    _WORDS = re.compile(r"\s*\S+|\s+")

    def __init__(self, tokenizer: Any):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._normalizer = getattr(backend, "normalizer", None) if backend is not None else None
        self._pre = getattr(backend, "pre_tokenizer", None) if backend is not None else None
        self._use_backend = self._pre is not None and len(self._pieces("a b c")) >= 3

    def _pieces(self, text: str) -> list[tuple[int, int]] | None:
        normalized = self._normalizer.normalize_str(text) if self._normalizer is not None else text
        if len(normalized) != len(text) or self._pre is None:
            return None
        return [span for _, span in self._pre.pre_tokenize_str(normalized)]

    def boundaries(self, text: str) -> set[int]:
        """Byte offsets of pre-token starts (and the end) in `text`."""
        spans = self._pieces(text) if self._use_backend else None
        if spans is None:
            spans = [match.span() for match in self._WORDS.finditer(text)]
        offsets = [0]
        for char in text:
            offsets.append(offsets[-1] + len(char.encode("utf-8")))
        found = {offsets[start] for start, _ in spans}
        found.add(offsets[-1])
        return found


@per_tokenizer
def pre_tokens(tokenizer: Any) -> PreTokens:
    return PreTokens(tokenizer)


@per_tokenizer
def leaf_index(tokenizer: Any, table: TokenTable) -> LeafIndex:
    """The `LeafIndex` of a tokenizer, built once (about a second for a large vocabulary)."""
    return LeafIndex(tokenizer, table)


def _encode_many(tokenizer: Any, table: TokenTable, texts: Sequence[str]) -> list[list[int] | None]:
    """Canonical ids for many texts at once (None where they do not spell the text exactly:
    a normaliser changed it). A SentencePiece dummy prefix is removed with an anchor."""
    out: list[list[int] | None] = []
    for text, ids in zip(texts, _encode_raw(tokenizer, table, texts), strict=True):
        spelled_ok = ids is not None and all(0 <= i < len(table) and table.token_bytes[i] is not None for i in ids)
        out.append(ids if spelled_ok and table.spell(ids) == text.encode("utf-8") else None)
    return out


def _encode_raw(tokenizer: Any, table: TokenTable, texts: Sequence[str]) -> list[list[int] | None]:
    """The tokenizer's ids for many texts at once, unchecked (None where the anchor that removes
    a SentencePiece dummy prefix did not survive)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    anchor = "\n" if table.adds_dummy_prefix else ""
    inputs = [anchor + t for t in texts]
    if backend is not None:
        raw = [e.ids for e in backend.encode_batch(inputs, add_special_tokens=False)]
    else:
        raw = [list(tokenizer.encode(t, add_special_tokens=False)) for t in inputs]
    anchor_ids: list[int] = []
    if anchor:
        anchor_ids = (
            backend.encode(anchor, add_special_tokens=False).ids if backend is not None else tokenizer.encode(anchor)
        )
    cut = len(anchor_ids)
    return [ids[cut:] if ids[:cut] == anchor_ids else None for ids in raw]


# ---------------------------------------------------------------------- one covering

_MAX_BRANCHES = 8  # a draft read as the member's own tokens branches where several ids spell a piece
# a usable path: the path, its leaves (on the device and as host data; None: every token), its
# candidates' probabilities, and how many tokens it has
_Pending = tuple["Path", "tuple[torch.Tensor, np.ndarray] | None", "torch.Tensor", int]


@dataclass
class _Reading:
    """A plan for reading a draft (see `CoveringMode.plan_read`)."""

    offsets: list[int]
    start: int
    adopted: int = 0
    pieces: list[bytes] = field(default_factory=list)
    first: dict[int, Covering | None] = field(default_factory=dict)  # frontier node -> covering at `adopted`
    tails: dict[int, list[Covering | None]] = field(default_factory=dict)  # frontier node -> later coverings


@dataclass
class Path:
    """Tokens after the trunk that end exactly at byte `end` of the remainder."""

    end: int
    tokens: tuple[int, ...]
    node: Node | None = None  # its last node (the trunk for the empty path)
    log_weight: float = 0.0


@dataclass
class Covering:
    """Every way a member covers the unstable remainder `rest` after `trunk` (see the module
    docstring), and, once evaluated, its distribution over continuations."""

    trunk: Node
    advance: tuple[int, ...]  # stable tokens added after the base to reach the trunk
    advance_bytes: int
    rest: bytes
    paths: list[Path]
    log_mass: float = 0.0  # log of the total probability of `rest` given the trunk
    dense_paths: list[Path] = field(default_factory=list)
    groups: list[tuple[Path, Any, Any]] = field(default_factory=list)  # (path, leaves, probs as host data)

    @property
    def exact(self) -> bool:
        return not self.rest


class CoveringMode:
    """`TreeSession`'s mode for `Boundary.CORRECT` (see the module docstring)."""

    def __init__(self, session: TreeSession, tokenizer: Any):
        self.session = session
        self.tokenizer = tokenizer
        self.table = session.vocab.table
        self._leaves: LeafIndex | None = None
        self._tokenisations: dict[bytes, list[list[int] | None]] = {}
        self._stable_cache: dict[bytes, set[int]] = {}

    @property
    def leaves(self) -> LeafIndex:
        if self._leaves is None:
            self._leaves = leaf_index(self.tokenizer, self.table)
        return self._leaves

    # ------------------------------------------------------------------ lifecycle

    def fixed_prefix(self, prompt: RenderedPrompt) -> int:
        return max(1, prompt.fixed)  # the first token stays: a trie needs a root (and a dummy prefix)

    def start(self, state: RequestState) -> None:
        tree = self.session.tree
        head = tree.row(state.key).history[state.fixed - 1]
        tree.set_head(state.key, head)  # the prompt's tail is re-read with the reply (its nodes stay for reuse)
        state.spelled = 0
        state.kept_until = state.fixed

    def lagging(self, state: RequestState) -> bool:
        return False

    def sync(self, state: RequestState, kept: int) -> None:
        """Nothing to encode (the next covering reads the new bytes), except that the member's
        last own token is read again when text it did not write follows it: its bytes may merge
        with what follows (Qwen wrote " allow", the ensemble added "s": kept as written, Qwen
        could only continue with tokens after " allow" that start with "s", and wrote
        "allowsthe"; read again, " allows" is one of the paths). `plan_read` applies the same
        rule inside a draft, so a verifier's state never depends on where a round began."""
        if not state.unspelled or not self._ends_with_own_token(state):
            return
        tree = self.session.tree
        head = tree.head(state.key)
        base, spelled = self._reread_from(state, head)
        if base is head:
            return
        tree.set_head(state.key, base)
        state.spelled -= len(spelled)
        state.kept_until -= 1
        state.own_head = False  # only the last own token is read again, once

    @staticmethod
    def _ends_with_own_token(state: RequestState) -> bool:
        """The history ends with a token the member wrote (kept at a commit, not moved since)."""
        return state.own_head

    def _reread_from(self, state: RequestState, node: Node) -> tuple[Node, bytes]:
        """Where text the member did not write that follows its own token `node` is covered
        from: the token's parent, with the token's bytes read again; `node` itself when it is
        part of the fixed prompt or a control token (which spells nothing and merges with nothing)."""
        spelled = self.table.token_bytes[node.token] or b""
        if node.parent is None or node.depth < state.fixed or not spelled:
            return node, b""
        return node.parent, spelled

    def nodes_to_keep(self, state: RequestState) -> Sequence[Node]:
        head = self.session.tree.head(state.key)
        return [n for n in head.children.values()]

    # ------------------------------------------------------------------ covering

    def tokenisations(self, text: bytes) -> list[list[int] | None]:
        """Canonical ids of `text` followed by each probe (cached; None where one cannot spell it)."""
        found = self._tokenisations.get(text)
        if found is None:
            try:
                decoded = text.decode("utf-8")
            except UnicodeDecodeError:
                decoded = None
            if decoded is None:
                found = [None] * len(PROBES)
            else:
                found = _encode_many(self.tokenizer, self.table, [decoded + p for p in PROBES])
            if len(self._tokenisations) > 2048:
                self._tokenisations.clear()
            self._tokenisations[text] = found
        return found

    def cover(self, base: Node, text: bytes) -> Covering | None:
        """The covering of `text` after `base` (None: the member cannot spell it at all).

        A text ending inside a UTF-8 character is tokenised up to that character's start (the
        character is unstable by definition); paths may go on into it with byte tokens.
        """
        tree = self.session.tree
        if not text:
            return Covering(base, (), 0, b"", [Path(0, (), base)])
        partial = incomplete_utf8_suffix(text)
        whole = text[: len(text) - partial]
        usable = [t for t in self.tokenisations(whole) if t is not None] if whole else [[]]
        if not usable:
            exact = self.session.encoder.encode(whole)
            if exact is None:
                return None
            usable = [exact]
        advance = tuple(self._stable_prefix(whole, usable))
        advance_bytes = len(self.table.spell(list(advance)))
        trunk = tree.path(base, advance)
        rest = text[advance_bytes:]
        paths = self._paths(usable, len(advance), rest[: len(rest) - partial])
        if partial:
            paths += self._into_character(paths, len(rest) - partial, text[-partial:])
        for path in paths:
            path.node = tree.path(trunk, path.tokens)
        return Covering(trunk, advance, advance_bytes, rest, paths)

    def _paths(self, tokenisations: list[list[int]], skip: int, rest: bytes) -> list[Path]:
        """Token paths after the first `skip` tokens that end exactly inside (or at the end of) `rest`."""
        found: dict[tuple[int, ...], Path] = {(): Path(0, ())}
        for ids in tokenisations:
            position = 0
            for k in range(skip, len(ids)):
                position += len(self.table.token_bytes[ids[k]] or b"")
                if position > len(rest):
                    break
                tokens = tuple(ids[skip : k + 1])
                if tokens not in found:
                    found[tokens] = Path(position, tokens)
        return sorted(found.values(), key=lambda p: (p.end, p.tokens))

    def _stable_prefix(self, whole: bytes, tokenisations: list[list[int]]) -> list[int]:
        """The tokens every tokenisation starts with, up to a point no later byte can move: a
        pre-token start of the text that stays one whatever follows, before its last pre-token."""
        common = _common_prefix(tokenisations)
        if not common:
            return []
        stable = self._stable_points(whole)
        position, end = 0, 0
        for k, token in enumerate(common):
            position += len(self.table.token_bytes[token] or b"")
            if position in stable:
                end = k + 1
        return common[:end]

    def _stable_points(self, whole: bytes) -> set[int]:
        found = self._stable_cache.get(whole)
        if found is None:
            splitter = pre_tokens(self.tokenizer)
            try:
                text = whole.decode("utf-8")
            except UnicodeDecodeError:
                return set()
            found = {b for b in splitter.boundaries(text) if b < len(whole)}
            for probe in PROBES[1:]:
                found &= splitter.boundaries(text + probe)
            if len(self._stable_cache) > 2048:
                self._stable_cache.clear()
            self._stable_cache[whole] = found
        return found

    def _into_character(self, paths: list[Path], start: int, pieces: bytes) -> list[Path]:
        """Paths that go on from the start of an incomplete character with its bytes as byte tokens."""
        byte_ids = self.session.encoder.byte_tokens(pieces)
        if byte_ids is None:
            return []
        found = []
        for path in [p for p in paths if p.end == start]:
            for k in range(1, len(byte_ids) + 1):
                found.append(Path(start + k, (*path.tokens, *byte_ids[:k])))
        return found

    def want(self, covering: Covering) -> None:
        tree = self.session.tree
        tree.want(covering.trunk)
        for path in covering.paths:
            if path.node is not None:
                tree.want(path.node)

    def evaluate(self, covering: Covering, temperature: float) -> Continuations | None:
        """The covering's distribution (its nodes' logits must be computed): one read."""
        return self.evaluate_all([covering], temperature)[0]

    def evaluate_all(self, coverings: Sequence[Covering], temperature: float) -> list[Continuations | None]:
        """Several coverings' distributions with ONE read for all of them: every path's token
        log-probabilities and leaf mass are computed on the device and read together; the
        weights are then host numbers, and each distribution is combined on the device."""
        prepared = [self._prepare(covering, temperature) for covering in coverings]
        tensors = []
        for pending, terms in prepared:
            tensors += [t.reshape(1) for t in terms] + [probs.sum().reshape(1) for _, _, probs, _ in pending]
            tensors += [probs for _, leaves, probs, _ in pending if leaves is not None]  # the groups' candidates
        numbers = iter(torch.cat([t.double() for t in tensors]).tolist() if tensors else [])  # the one read
        found = []
        for covering, (pending, terms) in zip(coverings, prepared, strict=True):
            mine = [next(numbers) for _ in range(len(terms) + len(pending))]
            raw = [[next(numbers) for _ in range(len(probs))] for _, leaves, probs, _ in pending if leaves is not None]
            found.append(self._combine(covering, temperature, pending, mine, raw))
        return found

    def _prepare(self, covering: Covering, temperature: float) -> tuple[list[_Pending], list[torch.Tensor]]:
        """Each usable path with its leaves (on the device and as host data, from `LeafIndex`) and
        candidates' probabilities, and its tokens' log terms (device scalars, nothing read)."""
        rest = covering.rest
        pending: list[_Pending] = []
        terms: list[torch.Tensor] = []
        for path in covering.paths:
            parents = _parents(covering.trunk, path)
            if parents is None or path.node is None:
                path.log_weight = -math.inf
                continue
            probs = _softmax(path.node, temperature)
            leaves = None
            if path.end < len(rest):
                leaves = self.leaves.longer_than(rest[path.end :], probs.shape[0], probs.device)
                if len(leaves[1]) == 0:
                    continue
                probs = probs[leaves[0]]
            terms.extend(_log_terms(p, t, temperature) for p, t in zip(parents, path.tokens, strict=True))
            pending.append((path, leaves, probs, len(path.tokens)))
        return pending, terms

    def _combine(
        self,
        covering: Covering,
        temperature: float,
        pending: list[_Pending],
        numbers: list[float],
        raw: list[list[float]],
    ) -> Continuations | None:
        """The distribution from the read numbers: per path its log terms (in path order), then
        per path its leaf mass; `raw`: per path with leaves, its candidates' probabilities. The
        partial groups are computed on the host from these and moved to the device, so host and
        device hold the same numbers and nothing needs reading again."""
        rest = covering.rest
        terms, masses = numbers[: len(numbers) - len(pending)], numbers[len(numbers) - len(pending) :]
        raws = iter(raw)
        found: list[tuple[Path, torch.Tensor | None, Any, float]] = []
        at = 0
        for (path, leaves, probs, count), mass in zip(pending, masses, strict=True):
            path.log_weight = 0.0
            for term in terms[at : at + count]:  # a Python sum, token by token
                path.log_weight += term
            at += count
            candidates = probs if leaves is None else np.asarray(next(raws), dtype=np.float64)
            if path.log_weight > -math.inf and mass > 0.0:
                found.append((path, leaves, candidates, path.log_weight + math.log(mass)))
        if not found:
            return self._canonical_only(covering, temperature)
        # weights relative to the heaviest contribution, so a remainder the model finds very
        # unlikely (random weights, a long odd tail) cannot underflow to 0/0 in float32
        scale = max(log_mass for *_, log_mass in found)
        dense = None
        dense_paths: list[Path] = []
        groups: list[tuple[Path, Any, Any]] = []  # (path, leaves, weighted probabilities as host data)
        total = 0.0
        for path, leaves, probs, log_mass in found:
            weight = math.exp(path.log_weight - scale)
            total += math.exp(log_mass - scale)
            if leaves is None:
                dense = probs * weight if dense is None else dense + probs * weight
                dense_paths.append(path)
            else:
                groups.append((path, leaves, probs * weight))
        if dense is None:
            width = self.session.vocab.width
            dense = torch.zeros(width, dtype=torch.float32, device=covering.trunk.logits.device)  # type: ignore[union-attr]
        covering.log_mass = scale + math.log(total)
        covering.dense_paths = dense_paths
        covering.groups = groups
        host = tuple((leaves[1], (probs / total).astype(np.float32)) for _, leaves, probs in groups)
        partial = tuple(
            PartialGroup(len(rest) - path.end, leaves[0], torch.from_numpy(probs).to(leaves[0].device), route=k)
            for k, ((path, leaves, _), (_, probs)) in enumerate(zip(groups, host, strict=True))
        )
        return Continuations(dense / total, partial, host=host)

    def _canonical_only(self, covering: Covering, temperature: float) -> Continuations | None:
        """Every covering path has probability 0 under the model (possible with hand-made
        distributions): condition on the tokenizer's own tokenisation of the remainder alone."""
        canonical = max(
            (p for p in covering.paths if p.end == len(covering.rest)), key=lambda p: len(p.tokens), default=None
        )
        if canonical is None or canonical.node is None or canonical.node.logits is None:
            return None
        canonical.log_weight = 0.0
        covering.log_mass = 0.0
        covering.dense_paths = [canonical]
        covering.groups = []
        return Continuations(_softmax(canonical.node, temperature))

    # ------------------------------------------------------------------ contract pieces

    def plan_next(self, state: RequestState):
        session = self.session
        if state.written:
            node = state.written[-1]
            session.tree.want(node)
            return node
        covering = self.cover(session.tree.head(state.key), state.unspelled)
        if covering is None:
            session.mark_stuck(state, state.unspelled)
            return None
        self._advance(state, covering)
        self.want(covering)
        return covering

    def _advance(self, state: RequestState, covering: Covering) -> None:
        """The covering's stable tokens join the history (they never change again)."""
        if covering.advance:
            self.session.tree.set_head(state.key, covering.trunk)
            state.own_head = False
            state.spelled += covering.advance_bytes
            self.session.count_reencoded(len(covering.advance), rolled_back=False)

    def finish(self, state: RequestState, plan, temperature: float) -> Continuations | None:
        from ensemble_core.members.session import Origin

        if isinstance(plan, Node):
            offset = self.session.writing_offset(state)
            return Continuations(self.session.dense(plan, temperature), origin=Origin(state.key, plan, offset))
        return self._continuations(state, plan, temperature, 0)

    def _continuations(self, state: RequestState, covering: Covering, temperature: float, offset: int):
        return self.continuations_all(state, [covering], temperature, [offset])[0]

    def continuations_all(
        self, state: RequestState, coverings: Sequence[Covering], temperature: float, offsets: Sequence[int]
    ) -> list[Continuations | None]:
        """Each covering's `Continuations` for the request (one read for all that need one)."""
        from ensemble_core.members.session import Origin

        inexact = [c for c in coverings if not c.exact]
        evaluated = dict(zip(map(id, inexact), self.evaluate_all(inexact, temperature), strict=True))
        out: list[Continuations | None] = []
        for covering, offset in zip(coverings, offsets, strict=True):
            if covering.exact:
                node = covering.trunk
                out.append(Continuations(self.session.dense(node, temperature), origin=Origin(state.key, node, offset)))
                continue
            found = evaluated[id(covering)]
            if found is None:
                self.session.mark_stuck(state, covering.rest)
                out.append(None)
                continue
            out.append(replace(found, origin=Origin(state.key, covering.trunk, offset, covering)))
        return out

    def write(self, state: RequestState, origin: Origin, pick: Pick) -> bool:
        session = self.session
        if origin.offset != max(0, session.writing_offset(state)):
            return False
        covering = origin.covering
        if covering is None or covering.exact:
            if origin.node is not session.writing_node(state) or pick.group != -1:
                return False
            if pick.index in session.vocab.eos_ids:
                return False
            session.append_written(state, [pick.index])
            return True
        if state.written or covering.trunk is not session.writing_node(state):
            return False
        if pick.group == -1:
            if pick.index in session.vocab.eos_ids:
                return False
            path = _likeliest_path(covering.dense_paths, pick.index)
            tokens = [*path.tokens, pick.index]
        else:
            path, leaves, _ = covering.groups[pick.group]
            tokens = [*path.tokens, int(leaves[1][pick.index])]  # the host's copy: nothing read
        session.append_written(state, tokens)
        return True

    # ------------------------------------------------------------------ reading a draft

    def plan_read(self, state: RequestState, pieces: list[bytes], adopt: int):
        """States along the draft from where the member has written up to.

        While its state is exact, a piece that is one of its tokens is read as its own token
        (among the first `adopt` pieces); where several of its ids spell the piece, every one
        is read (a branch each) and `finish_read` follows the one the member finds likeliest,
        which is the one it writes when it agrees. From the first piece it cannot read as its
        own on, the text is covered.
        """
        from ensemble_core.members.session import piece_offsets, reading_start

        session = self.session
        tree = session.tree
        offsets = piece_offsets(pieces)
        start = reading_start(session, state, offsets)
        if start is None:
            return _Reading(offsets, start=len(offsets))
        if not state.written:  # bring the stable part of the committed text into the history first
            covering = self.cover(tree.head(state.key), state.unspelled)
            if covering is None:
                session.mark_stuck(state, state.unspelled)
                return _Reading(offsets, start=len(offsets))
            self._advance(state, covering)
        reading = _Reading(offsets, start=start)
        frontier = [session.writing_node(state)]
        pending = b"" if state.written else state.unspelled
        j = start
        while j < min(adopt, len(pieces)) and not pending and len(frontier) <= _MAX_BRANCHES:
            ids = self.table.ids_by_bytes.get(pieces[j], ())
            if not ids:
                break
            for node in frontier:
                tree.want(node)
            frontier = [tree.child(node, token) for node in frontier for token in ids]
            j += 1
        reading.adopted = j
        own = j > start or bool(state.written) or (not pending and self._ends_with_own_token(state))
        for node in frontier:
            tree.want(node)
            tail: list[Covering | None] = []
            base, text = self._reread_from(state, node) if own else (node, b"")
            text += pending
            for piece in pieces[j:]:
                text += piece
                covering = self.cover(base, text)
                if covering is not None:
                    self.want(covering)
                tail.append(covering)
            if j == reading.start and pending:
                first = self.cover(node, pending)
                if first is not None:
                    self.want(first)
                reading.first[id(node)] = first
            reading.tails[id(node)] = tail
        reading.pieces = pieces
        return reading

    def finish_read(self, state: RequestState, plan: _Reading, temperature: float):
        """Follow the member's likeliest ids through the read pieces, then its coverings."""
        from ensemble_core.members.session import Origin

        out: list[Continuations | None] = [None] * len(plan.offsets)
        if plan.start >= len(plan.offsets):
            return out, 0
        node = self.session.writing_node(state)
        for j in range(plan.start, plan.adopted):
            out[j] = Continuations(
                self.session.dense(node, temperature), origin=Origin(state.key, node, plan.offsets[j])
            )
            node = self._likeliest_child(node, plan.pieces[j])
        first = plan.first.get(id(node))
        at: dict[int, Covering] = {}  # boundary -> its covering, all evaluated with one read
        if plan.adopted == plan.start and first is not None:
            at[plan.adopted] = first
        elif out[plan.adopted] is None:
            out[plan.adopted] = Continuations(
                self.session.dense(node, temperature), origin=Origin(state.key, node, plan.offsets[plan.adopted])
            )
        for k, covering in enumerate(plan.tails.get(id(node), [])):
            if covering is not None:
                at[plan.adopted + 1 + k] = covering
        found = self.continuations_all(state, list(at.values()), temperature, [plan.offsets[j] for j in at])
        for j, continuations in zip(at, found, strict=True):
            out[j] = continuations
        return out, plan.adopted

    def _likeliest_child(self, node: Node, piece: bytes) -> Node:
        """Of the ids spelling `piece`, the child the member gives the most probability to."""
        ids = self.table.ids_by_bytes.get(piece, ())
        if len(ids) == 1:
            return node.children[ids[0]]
        logits = node.logits
        best = max(ids, key=lambda t: float(logits[t]) if logits is not None and t < logits.shape[0] else -math.inf)
        return node.children[best]

    # ------------------------------------------------------------------ scoring

    def plan_score(self, state: RequestState, candidate: Candidate):
        from ensemble_core.members.session import _ScorePlan

        session = self.session
        tree = session.tree
        head = session.writing_node(state) if not state.written else tree.head(state.key)
        covering = self.cover(head, state.unspelled)
        if covering is None:
            return _ScorePlan([], head, missing=True), None
        if state.written and state.written_text == state.unspelled + candidate.data:
            written = [n.token for n in state.written]
            ids = (
                written[len(covering.advance) :] if written[: len(covering.advance)] == list(covering.advance) else None
            )
        else:
            ids = None
        if ids is None:
            text = covering.rest + candidate.data
            encoded = (self.tokenisations(text)[0] or session.encoder.encode(text)) if text else []
            if encoded is None:
                return _ScorePlan([], head, missing=True), None
            ids = list(encoded)
        if candidate.eos:
            ids = [*ids, session.end_id]
        self.want(covering)
        nodes = []
        node = covering.trunk
        for token in ids:
            node = tree.child(node, token)
            nodes.append(node)
        for node in nodes[:-1]:
            tree.want(node)
        return _ScorePlan(nodes, covering.trunk), covering

    def finish_score(self, state: RequestState, plan, kind: ScoreKind) -> CandidateScore:
        from ensemble_core.members.session import score_chain

        score_plan, covering = plan
        if covering is None or score_plan.missing:
            return score_chain(score_plan, kind)
        correction = 0.0
        if not covering.exact:
            if self.evaluate(covering, 1.0) is None:
                return CandidateScore(torch.tensor([float("-inf")]))
            correction = -covering.log_mass
        scored = score_chain(score_plan, kind)
        values = scored.values.clone()
        if kind is ScoreKind.LOGPROB:
            values[0] += correction
        inside = self._tokens_inside(score_plan.nodes, len(covering.rest))
        return CandidateScore(values, tokens=max(1, len(values) - inside))

    def _tokens_inside(self, nodes: list[Node], rest: int) -> int:
        """How many leading tokens lie entirely within the re-covered remainder."""
        position = 0
        for k, node in enumerate(nodes):
            position += len(self.table.token_bytes[node.token] or b"") if node.token < len(self.table) else 0
            if position > rest:
                return k
        return len(nodes)


def _common_prefix(tokenisations: list[list[int]]) -> list[int]:
    """The tokens every tokenisation starts with."""
    first = tokenisations[0]
    length = len(first)
    for other in tokenisations[1:]:
        k = 0
        limit = min(length, len(other))
        while k < limit and first[k] == other[k]:
            k += 1
        length = k
    return first[:length]


def _softmax(node: Node, temperature: float) -> torch.Tensor:
    return torch.softmax(tempered(node.logits.float(), temperature), dim=-1)  # type: ignore[union-attr]


def _parents(trunk: Node, path: Path) -> list[Node] | None:
    """The nodes each of the path's tokens follows (None when one of its nodes is gone)."""
    parents, parent = [], trunk
    for token in path.tokens:
        child = parent.children.get(token)
        if child is None:
            return None
        parents.append(parent)
        parent = child
    return parents


def _log_terms(node: Node, token: int, temperature: float) -> torch.Tensor:
    """log p(token | node) at `temperature`, a float32 scalar on the device (nothing read)."""
    logits = node.logits.float()  # type: ignore[union-attr]
    if temperature in (0.0, 1.0):
        return logits[token] - node.log_normaliser()
    logits = tempered(logits, temperature)
    return logits[token] - torch.logsumexp(logits, dim=-1)


def _likeliest_path(paths: list[Path], token: int) -> Path:
    """The dense path whose weight times p(token | its end) is largest (the first among equals);
    one read for all of them."""
    if len(paths) == 1:
        return paths[0]
    usable = [p.node is not None and p.node.logits is not None and token < p.node.logits.shape[0] for p in paths]
    terms = [_log_terms(p.node, token, 1.0) for p, ok in zip(paths, usable, strict=True) if ok]  # type: ignore[arg-type]
    read = iter(torch.stack(terms).tolist()) if terms else iter(())
    scores = [p.log_weight + next(read) if ok else -math.inf for p, ok in zip(paths, usable, strict=True)]
    return paths[max(range(len(paths)), key=scores.__getitem__)]
