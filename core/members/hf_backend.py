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

import torch
from transformers import DynamicCache

from ensemble_core.errors import ConfigError
from ensemble_core.members.token_tree import Backend, Node, TokenTree

_SUPPORTED_ATTENTION = ("sdpa", "eager")
_FULL, _SLIDING = "full_attention", "sliding_attention"
_COMPACT_MIN_DEAD = 64


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
        # Bookkeeping lives on the CPU (small, and touched entry by entry); the mask built from
        # it moves to the model's device once per forward.
        # per row and column: the depth of the row's node there, -1 where the row has none
        self._depth = torch.zeros((0, 0), dtype=torch.long)
        # per row and column: the node there is on the row's history chain
        self._history = torch.zeros((0, 0), dtype=torch.bool)
        self._tree: TokenTree | None = None

    @property
    def columns(self) -> int:
        return self._depth.shape[1]

    # ------------------------------------------------------------------ bookkeeping hooks

    def history_changed(self, row_index: int, added: Sequence[Node], removed: Sequence[Node]) -> None:
        for node in removed:
            if node.evaluated:
                self._history[row_index, node.slot] = False
        for node in added:
            if node.evaluated:
                self._history[row_index, node.slot] = True

    def bind(self, tree: TokenTree) -> None:
        self._tree = tree
        self._depth = torch.zeros((len(tree.rows), 0), dtype=torch.long)
        self._history = torch.zeros((len(tree.rows), 0), dtype=torch.bool)

    def release(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            if node.evaluated and self._tree is not None:
                index = self._tree.row_index(node.row.key)
                self._depth[index, node.slot] = -1
                self._history[index, node.slot] = False
            node.slot = -1

    def drop_rows(self, keep: Sequence[int]) -> None:
        if not keep:  # nothing left: start the next admitted rows on an empty cache
            self._cache = DynamicCache()
            self._depth = torch.zeros((0, 0), dtype=torch.long)
            self._history = torch.zeros((0, 0), dtype=torch.bool)
            return
        index = torch.tensor(list(keep), dtype=torch.long)
        if self.columns and self._cache.layers:
            self._cache.batch_select_indices(index.to(self._device))
        self._depth = self._depth[index]
        self._history = self._history[index]

    def add_rows(self, count: int) -> None:
        """New rows see none of the existing columns (depth -1), and their cache entries there
        are zeros that no mask ever lets them attend to; their prompts get fresh columns."""
        self._depth = torch.cat([self._depth, torch.full((count, self.columns), -1, dtype=torch.long)])
        self._history = torch.cat([self._history, torch.zeros((count, self.columns), dtype=torch.bool)])
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
                    node.slot = -1
        self._compact_if_sparse(tree)
        width = max(len(nodes) for nodes in pending.values())
        start = self.columns
        rows = len(tree.rows)
        input_ids = torch.full((rows, width), self._pad, dtype=torch.long)
        positions = torch.zeros((rows, width), dtype=torch.long)
        self._grow(width)
        for index, nodes in pending.items():
            for j, node in enumerate(nodes):
                node.slot = start + j
                input_ids[index, j] = node.token
                positions[index, j] = node.depth
                self._depth[index, node.slot] = node.depth
                if node.depth < len(node.row.history) and node.row.history[node.depth] is node:
                    self._history[index, node.slot] = True
        masks = None if self._plain(tree, pending, start) else self._masks(tree, pending, start, width, positions)
        keep_columns, owners = self._logit_columns(pending, start)
        logits = self._run(input_ids.to(self._device), positions.to(self._device), masks, keep_columns)
        for node, (row, column) in owners.items():
            node.logits = logits[row, column].clone()
            node._lse = None

    def _grow(self, width: int) -> None:
        rows = self._depth.shape[0]
        self._depth = torch.cat([self._depth, torch.full((rows, width), -1, dtype=torch.long)], dim=1)
        self._history = torch.cat([self._history, torch.zeros((rows, width), dtype=torch.bool)], dim=1)

    def _masks(
        self, tree: TokenTree, pending: dict[int, list[Node]], start: int, width: int, positions: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Per layer type, the additive 4-D mask [rows, 1, width, columns]."""
        rows, columns = len(tree.rows), self.columns
        allowed = torch.zeros((rows, width, columns), dtype=torch.bool)
        for index in range(rows):  # padding queries see themselves (their output is never used)
            used = len(pending.get(index, ()))
            pads = torch.arange(used, width)
            allowed[index, pads, start + pads] = True
        for index, nodes in pending.items():
            attach = torch.empty(len(nodes), dtype=torch.long)
            extra_q: list[int] = []
            extra_k: list[int] = []
            for j, node in enumerate(nodes):
                chain, branch_depth = self._off_history_chain(node)
                attach[j] = branch_depth
                for ancestor in chain:
                    extra_q.append(j)
                    extra_k.append(ancestor.slot)
            depth, history = self._depth[index], self._history[index]
            block = history[None, :] & (depth[None, :] <= attach[:, None])
            if extra_q:
                block[torch.tensor(extra_q), torch.tensor(extra_k)] = True
            allowed[index, : len(nodes)] = block
        query_depth = positions[:, :, None]
        key_depth = self._depth[:, None, :]
        masks: dict[str, torch.Tensor] = {}
        for kind, window in self._windows.items():
            kept = allowed if window is None else allowed & ((query_depth - key_depth) < window)
            if self._boolean_masks:
                masks[kind] = kept[:, None].to(self._device)
            else:
                additive = torch.zeros(kept.shape, dtype=self._dtype)
                additive.masked_fill_(~kept, torch.finfo(self._dtype).min)
                masks[kind] = additive[:, None].to(self._device)
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def _plain(self, tree: TokenTree, pending: dict[int, list[Node]], start: int) -> bool:
        """One row extending its own history with every earlier column live and in order: the
        model's own causal masks are exactly right (and give exactly what `generate` computes)."""
        if len(tree.rows) != 1 or 0 not in pending:
            return False
        nodes = pending[0]
        history = tree.rows[0].history
        if any(
            n.depth != start + j or n.depth >= len(history) or history[n.depth] is not n for j, n in enumerate(nodes)
        ):
            return False
        return bool((self._depth[0, :start] == torch.arange(start)).all()) and bool(self._history[0, :start].all())

    @staticmethod
    def _off_history_chain(node: Node) -> tuple[list[Node], int]:
        """The node's ancestors (itself included) that are not on its row's history, and the depth
        of the history node they hang from (the node's own depth when it is on the history)."""
        history = node.row.history
        chain: list[Node] = []
        current: Node | None = node
        while current is not None and not (current.depth < len(history) and history[current.depth] is current):
            chain.append(current)
            current = current.parent
        return chain, (current.depth if current is not None else -1)

    @staticmethod
    def _logit_columns(pending: dict[int, list[Node]], start: int) -> tuple[torch.Tensor, dict[Node, tuple[int, int]]]:
        wanted_columns = sorted({node.slot - start for nodes in pending.values() for node in nodes if node.wanted})
        position = {column: k for k, column in enumerate(wanted_columns)}
        owners = {
            node: (index, position[node.slot - start])
            for index, nodes in pending.items()
            for node in nodes
            if node.wanted
        }
        return torch.tensor(wanted_columns, dtype=torch.long), owners

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        masks: torch.Tensor | dict[str, torch.Tensor] | None,
        keep_columns: torch.Tensor,
    ) -> torch.Tensor:
        kwargs: dict[str, object] = {self._cache_argument: self._cache}
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = keep_columns.to(self._device) if len(keep_columns) else 1
        started = time.perf_counter()
        with torch.inference_mode():
            output = self._model(
                input_ids=input_ids, attention_mask=masks, position_ids=positions, use_cache=True, **kwargs
            )
        if self._tree is not None:
            self._tree.stats.forwards += 1
            self._tree.stats.tokens += int(input_ids.numel())
            self._tree.stats.seconds += time.perf_counter() - started
        logits = output.logits
        if not self._takes_logits_to_keep and len(keep_columns):
            logits = logits[:, keep_columns.to(logits.device)]
        return logits

    # ------------------------------------------------------------------ compaction

    def _compact_if_sparse(self, tree: TokenTree) -> None:
        """Squeeze dead columns out of the cache when they make up most of it."""
        if not self.columns:
            return
        live_per_row = (self._depth >= 0).sum(dim=1)
        longest = int(live_per_row.max())
        dead = self.columns - longest
        if dead < max(_COMPACT_MIN_DEAD, self.columns // 2):
            return
        order = torch.sort((self._depth < 0).to(torch.int8), dim=1, stable=True).indices[:, :longest]
        on_device = order.to(self._device)
        for layer in self._cache.layers:
            index = on_device[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, index)
            layer.values = torch.gather(layer.values, 2, index)
        new_column = torch.full_like(self._depth, -1)
        new_column.scatter_(1, order, torch.arange(longest).expand(len(order), -1).contiguous())
        self._depth = torch.gather(self._depth, 1, order)
        self._history = torch.gather(self._history, 1, order)
        for index, row in enumerate(tree.rows):
            for node in _evaluated_nodes(row):
                node.slot = int(new_column[index, node.slot])


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
