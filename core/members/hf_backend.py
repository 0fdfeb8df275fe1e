"""Evaluating token tries with a Hugging Face causal LM over ONE shared KV cache.

The cache has one column ("slot") per evaluated node, shared by all rows of the batch; a row's
nodes sit in columns of its own and every other column is masked for it. Each evaluation
appends as many columns as the row with the most pending nodes needs, and forwards the
pending nodes of every row in one pass. The attention mask is a 4-D mask built here: a node
sees exactly its ancestors (history up to where it branches, then its own chain), and in
sliding-window layers only those within the window by POSITION, so masked or dead columns
never shorten a window and sibling branches never see each other. Position ids are node
depths, so columns can be reordered freely; released nodes leave dead columns, which are
squeezed out when they pile up.

Every layer keeps its full length even for sliding-window models (Gemma-3): a rollback needs
tokens a sliding layer would have dropped, and the window is applied by the mask.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ensemble_core.errors import ConfigError
from ensemble_core.members.token_tree import Backend, Node, TokenTree

_SUPPORTED_ATTENTION = ("sdpa", "eager")
_FULL, _SLIDING = "full_attention", "sliding_attention"
_COMPACT_MIN_DEAD = 64
_FIRST_CAPACITY = 256  # columns the bookkeeping arrays start with (they double when full)


def attention_windows(config) -> dict[str, int | None]:
    """The model's attention layer types -> their window in positions (None: no window).

    Raises:
        ConfigError: a layer type this cache cannot mask (e.g. chunked or linear attention).
    """
    text_config = config.get_text_config()
    window = getattr(text_config, "sliding_window", None)
    types = getattr(text_config, "layer_types", None)
    if not types:
        types = [_SLIDING if window and getattr(text_config, "use_sliding_window", True) else _FULL]
    unknown = set(types) - {_FULL, _SLIDING}
    if unknown:
        raise ConfigError(
            f"The model uses attention layers of type {sorted(unknown)}, which ensemble-llm cannot mask yet; "
            "use a model with full or sliding-window attention."
        )
    return {kind: (int(window) if kind == _SLIDING else None) for kind in dict.fromkeys(types)}


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: transformers 5.2x renamed `past_key_values` to
    `cache`; both spellings are supported."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_attention(model: torch.nn.Module) -> None:
    """Tree masks are 4-D additive masks: only sdpa and eager attention take them."""
    implementation = getattr(model.config, "_attn_implementation", "sdpa") or "sdpa"
    if implementation not in _SUPPORTED_ATTENTION:
        raise ConfigError(
            f"The model's attention implementation is {implementation!r}; ensemble-llm needs one of "
            f"{list(_SUPPORTED_ATTENTION)} (custom 4-D masks). Load it with "
            "model_kwargs={'attn_implementation': 'sdpa'}."
        )


class HFBackend(Backend):
    """A Hugging Face causal LM with one KV cache for a batch of tries.

    Bookkeeping (which node sits in which column, at what depth, on which row's history) is host
    data in numpy arrays grown by doubling: nothing of it is a device read, and a step touches
    only the columns it adds, releases or moves onto or off a history. A single row extending
    its own history with every earlier column live and in order needs no mask at all (the
    model's own causal attention is exactly right, as in `generate`); that is checked
    incrementally, from the first column not yet verified. Other forwards get a 4-D mask built
    here with numpy and copied to the model's device once.

    Args:
        model: the causal LM (any architecture with a `DynamicCache`).
        pad_token_id: the id placed in padding columns (never attended to).
    """

    def __init__(self, model: torch.nn.Module, pad_token_id: int = 0):
        check_attention(model)
        self._model = model
        self._device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype
        self._windows = attention_windows(model.config)
        self._pad = pad_token_id
        # sdpa takes boolean masks (as transformers builds them); eager adds a float mask.
        self._boolean_masks = (getattr(model.config, "_attn_implementation", "sdpa") or "sdpa") == "sdpa"
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cache_argument = cache_keyword(model)
        self._cache = DynamicCache()
        self._timer = ForwardTimer(self._device)
        self._tree: TokenTree | None = None
        self._reset(0)

    def _reset(self, rows: int) -> None:
        # per row and column: the depth of the row's node there, -1 where the row has none...
        self._depth = np.full((rows, _FIRST_CAPACITY), -1, dtype=np.int64)
        # ...and whether that node is on the row's history chain
        self._history = np.zeros((rows, _FIRST_CAPACITY), dtype=bool)
        self._columns = 0
        self._forget_checks()

    def _forget_checks(self) -> None:
        self._clean = 0  # leading columns of row 0 known to be its history in order, all live
        self._bad: int | None = None  # a column known to break that (none known)

    def _touched(self, column: int) -> None:
        """A column's node, depth or history flag changed: the plain-forward check redoes it."""
        self._clean = min(self._clean, column)
        if self._bad is not None and column <= self._bad:
            self._bad = None

    @property
    def columns(self) -> int:
        return self._columns

    # ------------------------------------------------------------------ bookkeeping hooks

    def history_changed(self, row_index: int, added: Sequence[Node], removed: Sequence[Node]) -> None:
        for nodes, on in ((removed, False), (added, True)):
            for node in nodes:
                if node.evaluated:
                    self._history[row_index, node.slot] = on
                    self._touched(node.slot)

    def bind(self, tree: TokenTree) -> None:
        self._tree = tree
        self._reset(len(tree.rows))

    def release(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            if node.evaluated and self._tree is not None:
                index = self._tree.row_index(node.row.key)
                self._depth[index, node.slot] = -1
                self._history[index, node.slot] = False
                self._touched(node.slot)
            node.slot = -1

    def drop_rows(self, keep: Sequence[int]) -> None:
        if not keep:  # nothing left: start the next admitted rows on an empty cache
            self._cache = DynamicCache()
            self._reset(0)
            return
        if self.columns and self._cache.layers:
            _select_rows(self._cache, list(keep))
        self._depth = self._depth[list(keep)]
        self._history = self._history[list(keep)]
        self._forget_checks()

    def add_rows(self, count: int) -> None:
        """New rows see none of the existing columns (depth -1), and their cache entries there
        are zeros that no mask ever lets them attend to; their prompts get fresh columns."""
        capacity = self._depth.shape[1]
        self._depth = np.concatenate([self._depth, np.full((count, capacity), -1, dtype=np.int64)])
        self._history = np.concatenate([self._history, np.zeros((count, capacity), dtype=bool)])
        self._forget_checks()
        if not (self.columns and self._cache.layers):
            return
        for layer in self._cache.layers:
            for name in ("keys", "values"):
                held = getattr(layer, name, None)
                if held is None:  # a layer not filled yet (or one that shares another's cache)
                    continue
                blank = held.new_zeros((count, *held.shape[1:]))
                setattr(layer, name, torch.cat([held, blank]))

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, tree: TokenTree, pending: dict[int, list[Node]]) -> None:
        for index, nodes in pending.items():  # re-runs: an evaluated node whose logits are wanted again
            for node in nodes:
                if node.evaluated:
                    self._depth[index, node.slot] = -1
                    self._history[index, node.slot] = False
                    self._touched(node.slot)
                    node.slot = -1
        self._compact_if_sparse(tree)
        width = max(len(nodes) for nodes in pending.values())
        start = self.columns
        rows = len(tree.rows)
        input_ids = np.full((rows, width), self._pad, dtype=np.int64)
        positions = np.zeros((rows, width), dtype=np.int64)
        self._grow(width)
        for index, nodes in pending.items():
            row = tree.rows[index]
            for j, node in enumerate(nodes):
                node.slot = start + j
                input_ids[index, j] = node.token
                positions[index, j] = node.depth
                self._depth[index, node.slot] = node.depth
                self._history[index, node.slot] = row.on_history(node)
        masks = None if self._plain(tree, pending, start) else self._masks(tree, pending, start, width, positions)
        keep_columns, owners = self._logit_columns(pending, start)
        logits = self._run(self._on_device(input_ids), self._on_device(positions), masks, keep_columns)
        for node, (row_index, column) in owners.items():
            node.logits = logits[row_index, column].clone()
            node._lse = None

    def _on_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self._device, non_blocking=True)

    def _grow(self, width: int) -> None:
        """`width` more columns (the arrays double when full, so growing is amortised O(1))."""
        needed = self._columns + width
        capacity = self._depth.shape[1]
        if needed > capacity:
            bigger = max(2 * capacity, needed)
            rows = self._depth.shape[0]
            depth = np.full((rows, bigger), -1, dtype=np.int64)
            history = np.zeros((rows, bigger), dtype=bool)
            depth[:, :capacity] = self._depth
            history[:, :capacity] = self._history
            self._depth, self._history = depth, history
        self._columns = needed

    def _masks(
        self, tree: TokenTree, pending: dict[int, list[Node]], start: int, width: int, positions: np.ndarray
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Per layer type, the 4-D mask [rows, 1, width, columns] (boolean for sdpa, additive for eager)."""
        rows, columns = len(tree.rows), self.columns
        depth, history = self._depth[:, :columns], self._history[:, :columns]
        allowed = np.zeros((rows, width, columns), dtype=bool)
        for index in range(rows):  # padding queries see themselves (their output is never used)
            pads = np.arange(len(pending.get(index, ())), width)
            allowed[index, pads, start + pads] = True
        for index, nodes in pending.items():
            attach = np.empty(len(nodes), dtype=np.int64)
            extra_q: list[int] = []
            extra_k: list[int] = []
            for j, node in enumerate(nodes):
                chain, branch_depth = self._off_history_chain(node)
                attach[j] = branch_depth
                for ancestor in chain:
                    extra_q.append(j)
                    extra_k.append(ancestor.slot)
            block = history[index][None, :] & (depth[index][None, :] <= attach[:, None])
            if extra_q:
                block[extra_q, extra_k] = True
            allowed[index, : len(nodes)] = block
        masks: dict[str, torch.Tensor] = {}
        for kind, window in self._windows.items():
            kept = allowed if window is None else allowed & ((positions[:, :, None] - depth[:, None, :]) < window)
            on_device = torch.from_numpy(kept[:, None]).to(self._device, non_blocking=True)
            if self._boolean_masks:
                masks[kind] = on_device
            else:
                additive = torch.zeros(on_device.shape, dtype=self._dtype, device=self._device)
                masks[kind] = additive.masked_fill_(~on_device, torch.finfo(self._dtype).min)
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def _plain(self, tree: TokenTree, pending: dict[int, list[Node]], start: int) -> bool:
        """One row extending its own history with every earlier column live and in order: the
        model's own causal masks are exactly right (and give exactly what `generate` computes).
        Columns already verified are not looked at again (see `_touched`)."""
        if len(tree.rows) != 1 or 0 not in pending:
            return False
        row = tree.rows[0]
        if any(n.depth != start + j or not row.on_history(n) for j, n in enumerate(pending[0])):
            return False
        if self._bad is not None and self._bad < start:
            return False
        if self._clean < start:
            depth, history = self._depth[0, self._clean : start], self._history[0, self._clean : start]
            wrong = np.flatnonzero((depth != np.arange(self._clean, start)) | ~history)
            if len(wrong):
                self._clean = self._bad = self._clean + int(wrong[0])
                return False
            self._clean = start
        return True

    @staticmethod
    def _off_history_chain(node: Node) -> tuple[list[Node], int]:
        """The node's ancestors (itself included) that are not on its row's history, and the depth
        of the history node they hang from (the node's own depth when it is on the history)."""
        row = node.row
        chain: list[Node] = []
        current: Node | None = node
        while current is not None and not row.on_history(current):
            chain.append(current)
            current = current.parent
        return chain, (current.depth if current is not None else -1)

    @staticmethod
    def _logit_columns(pending: dict[int, list[Node]], start: int) -> tuple[list[int], dict[Node, tuple[int, int]]]:
        wanted_columns = sorted({node.slot - start for nodes in pending.values() for node in nodes if node.wanted})
        position = {column: k for k, column in enumerate(wanted_columns)}
        owners = {
            node: (index, position[node.slot - start])
            for index, nodes in pending.items()
            for node in nodes
            if node.wanted
        }
        return wanted_columns, owners

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        masks: torch.Tensor | dict[str, torch.Tensor] | None,
        keep_columns: list[int],
    ) -> torch.Tensor:
        kwargs: dict[str, object] = {self._cache_argument: self._cache}
        columns = torch.tensor(keep_columns, dtype=torch.long).to(self._device, non_blocking=True)
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = columns if keep_columns else 1
        timing = self._timer.start()
        with torch.inference_mode():
            output = self._model(
                input_ids=input_ids, attention_mask=masks, position_ids=positions, use_cache=True, **kwargs
            )
        if self._tree is not None:
            self._tree.stats.forwards += 1
            self._tree.stats.tokens += int(input_ids.shape[0] * input_ids.shape[1])
            self._tree.stats.add_time(self._timer.stop(timing))
        logits = output.logits
        if not self._takes_logits_to_keep and keep_columns:
            logits = logits[:, columns.to(logits.device)]
        return logits

    # ------------------------------------------------------------------ compaction

    def _compact_if_sparse(self, tree: TokenTree) -> None:
        """Squeeze dead columns out of the cache when they make up most of it."""
        if not self.columns:
            return
        depth = self._depth[:, : self.columns]
        longest = int((depth >= 0).sum(axis=1).max())
        dead = self.columns - longest
        if dead < max(_COMPACT_MIN_DEAD, self.columns // 2):
            return
        order = np.argsort(depth < 0, axis=1, kind="stable")[:, :longest]
        for layer in self._cache.layers:
            on_device = torch.from_numpy(order).to(layer.keys.device)
            index = on_device[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, index)
            layer.values = torch.gather(layer.values, 2, index)
        new_column = np.full(depth.shape, -1, dtype=np.int64)
        np.put_along_axis(new_column, order, np.arange(longest)[None, :].repeat(len(order), axis=0), axis=1)
        capacity = self._depth.shape[1]
        compacted_depth = np.full((len(order), capacity), -1, dtype=np.int64)
        compacted_history = np.zeros((len(order), capacity), dtype=bool)
        compacted_depth[:, :longest] = np.take_along_axis(depth, order, axis=1)
        compacted_history[:, :longest] = np.take_along_axis(self._history[:, : self.columns], order, axis=1)
        self._depth, self._history, self._columns = compacted_depth, compacted_history, longest
        self._forget_checks()
        for index, row in enumerate(tree.rows):
            for node in _evaluated_nodes(row):
                node.slot = int(new_column[index, node.slot])


class ForwardTimer:
    """The model's own time per forward. On CUDA, kernels run after the call returns, so a host
    clock would time only their launch: each forward is bracketed by two CUDA events instead,
    and their times are read when the totals are (`EvaluationStats.seconds`), once per
    generation rather than once per forward."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"

    def start(self) -> object:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started: object) -> float | tuple[object, object]:
        """Seconds (host clock), or the (start, end) event pair to read later."""
        if not self._cuda:
            return time.perf_counter() - started  # type: ignore[operator]
        ended = torch.cuda.Event(enable_timing=True)
        ended.record()
        return started, ended


def _select_rows(cache: DynamicCache, keep: list[int]) -> None:
    """Keep these batch rows of every layer, each indexed on its own device (a model split over
    devices with `device_map` keeps each layer's cache where the layer is)."""
    for layer in cache.layers:
        held = getattr(layer, "keys", None)
        device = held.device if isinstance(held, torch.Tensor) else torch.device("cpu")
        layer.batch_select_indices(torch.tensor(keep, dtype=torch.long, device=device))


def _evaluated_nodes(row) -> list[Node]:
    found: list[Node] = []
    if row.root is None:
        return found
    stack = [row.root]
    while stack:
        node = stack.pop()
        if node.evaluated:
            found.append(node)
        stack.extend(node.children.values())
    return found
