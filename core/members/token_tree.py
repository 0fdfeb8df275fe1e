"""Per request, a trie of token ids over one model cache: history, drafts, readings, coverings.

Every move a member makes is a path of token ids hanging off what it has already read: its
history (prompt + reply ids it keeps), its own drafts ahead of the committed text, its readings
of other members' drafts, the candidate continuations it scores, and (with prompt-boundary
correction) every way its tokenizer can cover the unstable end of the committed text. They all
share the history's cache entries, so one structure serves them all: a trie per request whose
nodes are token ids. A node's next-token logits are computed once, in ONE batched evaluation
of everything pending in all requests, and reused until the node is released.

`Node.depth` is the token's position id (its index in its row's sequence), so a row's tokens
can sit in any cache column: a node attends to exactly its ancestors (and, for sliding-window
layers, those within the window by POSITION), whatever else the cache holds.

The evaluation itself is a `Backend`: `HFBackend` runs a Hugging Face model over a shared KV
cache (`hf_backend.py`); `testing.FunctionBackend` calls a plain logits function.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ensemble_core.errors import ConfigError, EnsembleError, MemberFailedError

KEEP_HISTORY_LOGITS = 8  # history nodes nearest the head that keep their logits


@dataclass(eq=False)
class Node:
    """One token in a request's trie.

    Attributes:
        token: the token id.
        parent: the node before it (None for the first prompt token).
        depth: its position id (0 for the first token).
        row: the request's `Row`.
        children: token id -> child node.
        slot: its cache column (-1 until evaluated; backends without a cache leave it).
        logits: next-token logits after it (kept when asked for).
        wanted: compute `logits` at the next evaluation.
        alive: False once released.
    """

    token: int
    parent: Node | None
    depth: int
    row: Row
    children: dict[int, Node] = field(default_factory=dict)
    slot: int = -1
    logits: torch.Tensor | None = None
    wanted: bool = False
    alive: bool = True
    _lse: torch.Tensor | None = None

    @property
    def evaluated(self) -> bool:
        return self.slot >= 0

    def ancestry(self) -> list[Node]:
        """Root ... self."""
        chain: list[Node] = []
        node: Node | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        return chain

    def ids(self) -> list[int]:
        return [n.token for n in self.ancestry()]

    def log_normaliser(self) -> torch.Tensor:
        """logsumexp of this node's float32 logits (cached: path probabilities read it often)."""
        if self._lse is None:
            if self.logits is None:
                raise RuntimeError("the node's logits were not computed")
            self._lse = torch.logsumexp(self.logits.float(), dim=-1)
        return self._lse

    def logprob(self, token: int) -> torch.Tensor:
        """log p(token | this node and its ancestors), at temperature 1: a float32 scalar on the
        logits' device, not read (a candidate's tokens are read together)."""
        if self.logits is None:
            raise RuntimeError("the node's logits were not computed")
        return self.logits[token].float() - self.log_normaliser()


@dataclass(eq=False)
class Row:
    """One request's trie and its history chain (the ids the member keeps)."""

    key: int
    root: Node | None = None
    history: list[Node] = field(default_factory=list)
    pending: list[Node] = field(default_factory=list)
    branched: list[Node] = field(default_factory=list)  # history nodes above the head that grew a branch

    @property
    def head(self) -> Node:
        return self.history[-1]

    def on_history(self, node: Node) -> bool:
        """Whether `node` is on this row's history chain (O(1): a history node's index is its depth)."""
        return node.depth < len(self.history) and self.history[node.depth] is node


class Backend(ABC):
    """Computes logits for the pending nodes of a trie (and owns any cache they use)."""

    @abstractmethod
    def evaluate(self, tree: TokenTree, pending: dict[int, list[Node]]) -> None:
        """Give every pending node a slot, and `logits` to those with `wanted` set.

        Args:
            pending: row index -> its unevaluated nodes, parents before children.
        """

    def bind(self, tree: TokenTree) -> None:  # noqa: B027 - optional hook
        """The tree this backend evaluates (called once, before anything else)."""

    def release(self, nodes: Sequence[Node]) -> None:  # noqa: B027 - optional hook
        """These nodes are gone (their cache entries may be reused)."""

    def drop_rows(self, keep: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Only the rows at these indices remain, in this order (none: the tree is empty)."""

    def add_rows(self, count: int) -> None:  # noqa: B027 - optional hook
        """`count` new rows follow the existing ones (requests admitted into a running batch);
        their nodes are pending, nothing of theirs is cached yet."""

    def history_changed(self, row_index: int, added: Sequence[Node], removed: Sequence[Node]) -> None:  # noqa: B027
        """A row's history chain gained or lost nodes (a cached backend tracks what they see)."""


@dataclass
class EvaluationStats:
    """Evaluations and the model's own time in them.

    `seconds` adds host-clock times as they come; on CUDA a forward's time is a pair of events
    (`hf_backend.ForwardTimer`), read only when `seconds` is, so timing costs no sync per forward."""

    forwards: int = 0
    tokens: int = 0
    _seconds: float = 0.0
    _events: list[tuple[Any, Any]] = field(default_factory=list)

    def add_time(self, taken: float | tuple[Any, Any]) -> None:
        if isinstance(taken, tuple):
            self._events.append(taken)
        else:
            self._seconds += taken

    @property
    def seconds(self) -> float:
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000
            self._events.clear()
        return self._seconds


class TokenTree:
    """The tries of a batch of requests over one backend.

    Args:
        backend: what computes logits.
        prompts: per request key, its prompt ids (non-empty).
    """

    def __init__(self, backend: Backend, prompts: dict[int, Sequence[int]], owner: str = "?"):
        if not prompts:
            raise ConfigError("A batch needs at least one prompt, but got none.")
        self.backend = backend
        self.owner = owner  # the member's name, for the error when its forward fails
        self.stats = EvaluationStats()
        self.rows: list[Row] = []
        self._index: dict[int, int] = {}
        self._check(prompts)
        backend.bind(self)
        self.add(prompts)

    def _check(self, prompts: dict[int, Sequence[int]]) -> None:
        for key, ids in prompts.items():
            if len(ids) == 0:
                raise ConfigError(f"Prompt {key} has no tokens; every prompt needs at least one token.")
            if key in self._index:
                raise ValueError(f"request {key} is already in this batch")

    def add(self, prompts: dict[int, Sequence[int]]) -> None:
        """New requests join the batch as rows after the existing ones (their prompts are
        pending: the next evaluation forwards them together with everything else pending)."""
        self._check(prompts)
        ends: dict[int, Node] = {}
        for key, ids in prompts.items():
            row = Row(key=key)
            self._index[key] = len(self.rows)
            self.rows.append(row)
            ends[key] = self.path(self._root(row, int(ids[0])), [int(t) for t in ids[1:]])
        self.backend.add_rows(len(ends))
        for key, end in ends.items():
            self.set_head(key, end)

    # ------------------------------------------------------------------ structure

    def row(self, key: int) -> Row:
        return self.rows[self._index[key]]

    def row_index(self, key: int) -> int:
        return self._index[key]

    def head(self, key: int) -> Node:
        return self.row(key).head

    def _root(self, row: Row, token: int) -> Node:
        row.root = Node(token=token, parent=None, depth=0, row=row)
        row.pending.append(row.root)
        return row.root

    def child(self, node: Node, token: int) -> Node:
        """The node for `token` after `node` (made once; later calls return the same node)."""
        if not node.alive:
            raise RuntimeError("a released node cannot grow")
        found = node.children.get(token)
        if found is None:
            found = Node(token=int(token), parent=node, depth=node.depth + 1, row=node.row)
            node.children[int(token)] = found
            node.row.pending.append(found)
            row = node.row
            if row.history and node is not row.history[-1] and row.on_history(node):
                row.branched.append(node)  # a branch above the head: `set_head` trims it
        return found

    def path(self, node: Node, tokens: Sequence[int]) -> Node:
        """The node after following `tokens` from `node`."""
        for token in tokens:
            node = self.child(node, token)
        return node

    def want(self, node: Node) -> None:
        """Compute this node's logits at the next evaluation (if they are not there yet)."""
        if node.logits is None:
            node.wanted = True
            node.row.pending.append(node)

    def set_head(self, key: int, node: Node) -> None:
        """Make `node` the end of the row's history: the chain root..node is kept, and every node
        that is neither on it nor below `node` is released.

        Work is proportional to how far the history moves, not to its length: history nodes above
        the branch point already have one child each (the next history node), except those that
        grew another since (`Row.branched`), which are trimmed here too."""
        row = self.row(key)
        segment: list[Node] = []  # the new chain below the branch point, deepest first
        current: Node | None = node
        while current is not None and not row.on_history(current):
            segment.append(current)
            current = current.parent
        if current is None and (row.history or segment[-1] is not row.root):
            raise RuntimeError("the new head is not in this row")
        branch = -1 if current is None else current.depth  # -1: a new row's first history
        segment.reverse()
        removed = row.history[branch + 1 :]
        del row.history[branch + 1 :]
        row.history.extend(segment)
        # siblings along the new chain, from the branch point down (and any history node that
        # grew another child since the last move), are off every path we keep
        trim = {id(n): n for n in row.history[max(branch, 0) : -1]}
        trim.update((id(n), n) for n in row.branched if row.on_history(n) and n is not node)
        row.branched = []
        doomed: list[Node] = []
        for kept in trim.values():
            following = row.history[kept.depth + 1]
            doomed.extend(child for child in kept.children.values() if child is not following)
            kept.children = {following.token: following}
        self._release_subtrees(doomed)
        if removed or segment:
            self.backend.history_changed(self._index[key], segment, removed)

    def prune(self, key: int, keep: Sequence[Node] = ()) -> None:
        """Release every node below the head except `keep` (and their ancestors up to the head)."""
        head = self.head(key)
        wanted: set[int] = set()
        for kept in keep:
            current: Node | None = kept
            while current is not None and current.depth > head.depth and id(current) not in wanted:
                wanted.add(id(current))
                current = current.parent
        doomed = [c for c in head.children.values() if id(c) not in wanted]
        for c in list(head.children.values()):
            if id(c) in wanted:
                doomed.extend(self._unwanted_below(c, wanted))
        for node in doomed:
            if node.parent is not None:
                node.parent.children.pop(node.token, None)
        self._release_subtrees(doomed)

    def _unwanted_below(self, node: Node, wanted: set[int]) -> list[Node]:
        found = []
        for child in node.children.values():
            if id(child) in wanted:
                found.extend(self._unwanted_below(child, wanted))
            else:
                found.append(child)
        return found

    def _release_subtrees(self, roots: Sequence[Node]) -> None:
        gone: list[Node] = []
        stack = list(roots)
        while stack:
            node = stack.pop()
            if not node.alive:
                continue
            node.alive = False
            node.logits = None
            node._lse = None
            gone.append(node)
            stack.extend(node.children.values())
        if gone:
            self.backend.release(gone)

    def drop(self, keys: Sequence[int]) -> None:
        """These requests ended; their rows go."""
        gone = set(keys)
        keep = [i for i, row in enumerate(self.rows) if row.key not in gone]
        for row in self.rows:
            if row.key in gone and row.root is not None:
                self._release_subtrees([row.root])
        self.backend.drop_rows(keep)
        self.rows = [self.rows[i] for i in keep]
        self._index = {row.key: i for i, row in enumerate(self.rows)}

    # ------------------------------------------------------------------ evaluation

    def pending(self) -> dict[int, list[Node]]:
        """Row index -> nodes to evaluate (new ones, and evaluated ones whose logits are wanted
        again), parents before children."""
        found: dict[int, list[Node]] = {}
        for index, row in enumerate(self.rows):
            nodes = [n for n in row.pending if n.alive and (not n.evaluated or (n.wanted and n.logits is None))]
            row.pending = []
            if nodes:
                unique = list({id(n): n for n in nodes}.values())
                unique.sort(key=lambda n: n.depth)
                found[index] = unique
        return found

    def evaluate(self) -> None:
        """ONE evaluation of everything pending in every row (nothing happens if nothing is)."""
        pending = self.pending()
        if not pending:
            return
        try:
            self.backend.evaluate(self, pending)
        except EnsembleError:
            raise
        except Exception as error:  # out of memory, a driver error: the member's failure, named
            raise MemberFailedError.of(self.owner, error) from error
        for nodes in pending.values():
            for node in nodes:
                node.wanted = False
        for row in self.rows:
            self._forget_old_history_logits(row)

    def _forget_old_history_logits(self, row: Row) -> None:
        """History nodes keep their logits only near the head (a rollback there costs nothing);
        older ones are re-run if ever needed again."""
        for node in row.history[-KEEP_HISTORY_LOGITS - 4 : -KEEP_HISTORY_LOGITS]:
            if node.logits is not None and not node.children.keys() - {row.history[node.depth + 1].token}:
                node.logits = None
                node._lse = None
