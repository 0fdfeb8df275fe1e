"""A batch of token sequences of different lengths over one shared KV cache.

Every method needs the same few moves on each member: prefill prompts, read next-token
logits, append tokens, roll back (crop), and score several candidate continuations. This
module does them for a whole batch at once, with the cache kept, so no method ever
re-prefills a prefix.

How the batch is laid out: the cache has one column ("slot") per forwarded position, shared
by all rows. Each row owns an ordered list of slots holding its tokens; every other slot is
masked out for that row (attention mask 0). Prompts are left-padded; a row that appends
fewer tokens than another in the same forward gets masked pad slots in front of its new
tokens, so every row's latest token sits in the last column and its next-token logits are
`logits[:, -1]`. Position ids are given explicitly (a token's index in its own row), so
masked slots never shift positions, and rolled-back slots are masked, then physically cut
once no row uses the end of the cache.

Every layer is a full-length `DynamicLayer` even for sliding-window models (Gemma-3): the
window is applied by the attention mask, and a rollback needs the tokens a sliding layer
would already have thrown away. The window is counted in slots. A single row never has
masked slots after its first token, and rows that advance in lockstep (as `Single` decodes)
keep their tokens contiguous, so both are exact. In a batch whose rows append or roll back
different amounts, a row with masked slots inside its last `sliding_window` slots sees that
many fewer tokens of window (the same as transformers' own left-padded `generate`).

Logits are those the model returns (its dtype); callers convert to float32 where they
accumulate.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ensemble_core.errors import ConfigError


@dataclass
class _Row:
    """One sequence: its token ids and, for the cached prefix, the slot each one sits in."""

    ids: list[int]
    slots: list[int] = field(default_factory=list)
    # token index -> next-token logits after that token, for the last few forwarded positions:
    # a rollback to any of them needs no forward at all.
    recent: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        return len(self.ids) - len(self.slots)


@dataclass
class ForwardStats:
    """Forward passes and seconds spent in them (the model's own time, no bookkeeping)."""

    forwards: int = 0
    seconds: float = 0.0
    tokens: int = 0


class KVBatch:
    """Token ids of several sequences, their KV cache, and the moves every method needs.

    Reading logits (`next_logits`, `forward_pending`) runs ONE forward over the tokens every
    row has pending, so any number of `extend`/`truncate` calls cost a single catch-up pass.

    Args:
        model: a Hugging Face causal LM (any architecture with a `DynamicCache`).
        prompts: token ids per row; each non-empty.
        pad_token_id: the id placed in masked slots (never attended to).
        keep_recent: how many of a row's latest positions keep their next-token logits
            (a rollback by up to this many tokens then costs no forward).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        prompts: Sequence[Sequence[int]],
        pad_token_id: int = 0,
        keep_recent: int = 8,
    ):
        if not prompts:
            raise ConfigError("A batch needs at least one prompt, but got an empty list.")
        for index, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ConfigError(f"Prompt {index} has no tokens; every prompt needs at least one token.")
        self._model = model
        self._device = next(model.parameters()).device
        self._rows = [_Row(ids=[int(t) for t in prompt]) for prompt in prompts]
        self._cache = DynamicCache()
        self._mask = torch.zeros((len(self._rows), 0), dtype=torch.long, device=self._device)
        self._pad = pad_token_id
        self._keep_recent = max(1, keep_recent)
        accepted = inspect.signature(model.forward).parameters
        self._takes_logits_to_keep = "logits_to_keep" in accepted
        # transformers 5.2x renamed `past_key_values` to `cache`; support both spellings.
        self._cache_argument = "cache" if "cache" in accepted else "past_key_values"
        self.stats = ForwardStats()

    # ----------------------------------------------------------------- bookkeeping

    @property
    def batch_size(self) -> int:
        return len(self._rows)

    @property
    def cache_length(self) -> int:
        """Slots in the shared cache (live and masked); the width of the attention mask."""
        return self._mask.shape[1]

    def ids(self, row: int) -> list[int]:
        """A copy of the row's token ids (prompt and everything appended)."""
        return list(self._rows[row].ids)

    def length(self, row: int) -> int:
        return len(self._rows[row].ids)

    def cached_length(self, row: int) -> int:
        """How many of the row's first ids are in the cache (the rest are pending)."""
        return len(self._rows[row].slots)

    def extend(self, row: int, token_ids: Sequence[int]) -> None:
        """Append tokens to a row; they are forwarded at the next logits read."""
        self._rows[row].ids.extend(int(t) for t in token_ids)

    def truncate(self, row: int, length: int) -> None:
        """Keep only the first `length` tokens of a row (KV-cache rollback).

        The cache keeps the slots of the kept tokens. If the logits after the new last token
        are not among the recent ones kept, that one token is forwarded again at the next read.
        """
        state = self._rows[row]
        if not 1 <= length <= len(state.ids):
            raise ConfigError(f"`length` must be in [1, {len(state.ids)}] for row {row}, but is {length}.")
        del state.ids[length:]
        for index in [i for i in state.recent if i >= length]:
            del state.recent[index]
        keep = min(len(state.slots), length)
        if keep == length and length - 1 not in state.recent:
            keep = length - 1
        if keep < len(state.slots):
            dropped = torch.tensor(state.slots[keep:], dtype=torch.long, device=self._device)
            self._mask[row, dropped] = 0
            del state.slots[keep:]
            self._cut_unused_tail()

    def select_rows(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in that order): finished sequences stop costing compute."""
        if not rows:
            raise ConfigError("`select_rows` needs at least one row to keep.")
        index = torch.tensor(list(rows), dtype=torch.long, device=self._device)
        if self.cache_length:
            self._cache.batch_select_indices(index)
        self._mask = self._mask[index]
        self._rows = [self._rows[r] for r in rows]
        self._cut_unused_tail()

    def _cut_unused_tail(self) -> None:
        live = max((state.slots[-1] + 1 for state in self._rows if state.slots), default=0)
        surplus = self.cache_length - live
        if surplus > 0:
            self._cache.crop(-surplus)
            self._mask = self._mask[:, :live]

    # ----------------------------------------------------------------- forwards

    def next_logits(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Next-token logits after each row's last token, shape [len(rows), logits width]."""
        wanted = range(self.batch_size) if rows is None else rows
        if any(self._needs_forward(r) for r in wanted):
            self.forward_pending()
        return torch.stack([self._rows[r].recent[len(self._rows[r].ids) - 1] for r in wanted])

    def logits_after(self, row: int, index: int) -> torch.Tensor | None:
        """Next-token logits after token `index` of a row, if still kept (see `keep_recent`)."""
        return self._rows[row].recent.get(index)

    def _needs_forward(self, row: int) -> bool:
        state = self._rows[row]
        return state.pending > 0 or len(state.ids) - 1 not in state.recent

    def forward_pending(self, keep_all: bool = False) -> None:
        """Forward every row's pending tokens in ONE pass.

        Args:
            keep_all: keep the logits at every newly forwarded position (what a verifier
                needs to score drafted tokens; read them with `logits_after`); otherwise only
                each row's last position is computed, as `generate` does.
        """
        for row, state in enumerate(self._rows):  # a row whose last token's logits are gone re-runs it
            if state.pending == 0 and len(state.ids) - 1 not in state.recent:
                self.truncate(row, len(state.ids))
        width = max(state.pending for state in self._rows)
        if width == 0:
            return
        input_ids, block_mask, positions = self._pending_block(width)
        self._mask = torch.cat([self._mask, block_mask], dim=1)
        start = self.cache_length - width
        logits = self._run(input_ids, positions, self._cache, self._mask, keep=0 if keep_all else 1)
        for row, state in enumerate(self._rows):
            count = state.pending
            if count == 0:
                continue
            state.slots.extend(range(start + width - count, start + width))
            last = len(state.ids) - 1
            if keep_all:  # column width - count + k predicts the token after new token k
                for k in range(count):
                    state.recent[last - count + 1 + k] = logits[row, width - count + k]
            else:  # only the last column was computed
                state.recent[last] = logits[row, -1]
            for index in [i for i in state.recent if i <= last - self._keep_recent]:
                del state.recent[index]

    def _pending_block(self, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = self.batch_size
        input_ids = torch.full((batch, width), self._pad, dtype=torch.long)
        block_mask = torch.zeros((batch, width), dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for row, state in enumerate(self._rows):
            count = state.pending
            if count == 0:
                continue
            first = len(state.slots)
            input_ids[row, width - count :] = torch.tensor(state.ids[first:], dtype=torch.long)
            block_mask[row, width - count :] = 1
            positions[row, width - count :] = torch.arange(first, first + count)
            positions[row, : width - count] = first  # masked pads: any in-range position will do
        return input_ids.to(self._device), block_mask.to(self._device), positions.to(self._device)

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        mask: torch.Tensor,
        keep: int,
    ) -> torch.Tensor:
        kwargs: dict[str, object] = {self._cache_argument: cache}
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = keep
        started = time.perf_counter()
        with torch.inference_mode():
            output = self._model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **kwargs,
            )
        self.stats.forwards += 1
        self.stats.tokens += int(input_ids.numel())
        self.stats.seconds += time.perf_counter() - started
        logits = output.logits
        return logits if keep != 1 or logits.shape[1] == 1 else logits[:, -1:]

    # ----------------------------------------------------------------- scoring

    def score(self, row: int, continuations: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per-token log-probabilities of K candidate continuations of one row's ids, in ONE forward."""
        return self.score_many([ScoreRequest(row, self.length(row), continuations)])[0]

    def score_many(self, requests: Sequence[ScoreRequest], kind: str = "logprob") -> list[list[torch.Tensor]]:
        """Score candidate continuations of several rows' prefixes in ONE forward.

        Each request's prefix (the row's first `prefix_length` tokens, which must be cached:
        ids after it, e.g. a draft, are masked out) is shared by its candidates: the cache is
        copied once per candidate, so every architecture's own masks apply unchanged. The
        prefix's last token is fed again in front of each candidate, so the first candidate
        token is scored in the same pass and no stored logits are needed. Rows are left as
        they were.

        Args:
            kind: "logprob" (log-softmax) or "logit" (the raw logit of each candidate token).

        Returns:
            Per request, per candidate, a float32 tensor [len(candidate)]:
            log p(token_j | prefix, candidate tokens before j) (or that token's raw logit).
        """
        for request in requests:
            state = self._rows[request.row]
            if not request.continuations or any(len(c) == 0 for c in request.continuations):
                raise ConfigError("Scoring needs at least one continuation, each with at least one token.")
            if not 1 <= request.prefix_length <= len(state.slots) + 1 or request.prefix_length > len(state.ids):
                raise ConfigError(
                    f"Row {request.row}: the prefix to score after ({request.prefix_length} tokens) must be cached."
                )
        owners = [(q, request.row) for q, request in enumerate(requests) for _ in request.continuations]
        candidates = [list(c) for request in requests for c in request.continuations]
        longest = max(len(c) for c in candidates)
        inputs = torch.full((len(candidates), longest), self._pad, dtype=torch.long)
        positions = torch.zeros((len(candidates), longest), dtype=torch.long)
        for k, ((q, row), candidate) in enumerate(zip(owners, candidates, strict=True)):
            last = requests[q].prefix_length - 1
            inputs[k, : len(candidate)] = torch.tensor([self._rows[row].ids[last], *candidate[:-1]], dtype=torch.long)
            positions[k] = torch.arange(last, last + longest)
        cache, mask = self._prefix_cache([row for _, row in owners], [requests[q].prefix_length for q, _ in owners])
        mask = torch.cat([mask, torch.ones((len(candidates), longest), dtype=torch.long, device=self._device)], dim=1)
        logits = self._run(inputs.to(self._device), positions.to(self._device), cache, mask, keep=0)
        logprobs = logits.float().log_softmax(-1) if kind == "logprob" else logits.float()
        scores: list[list[torch.Tensor]] = [[] for _ in requests]
        for k, ((q, _), candidate) in enumerate(zip(owners, candidates, strict=True)):
            targets = torch.tensor(candidate, dtype=torch.long, device=logprobs.device)
            scores[q].append(logprobs[k, torch.arange(len(candidate), device=logprobs.device), targets])
        return scores

    def _prefix_cache(self, rows: list[int], prefix_lengths: list[int]) -> tuple[DynamicCache, torch.Tensor]:
        """A throwaway cache with one row per candidate: its row's keys/values, and a mask that
        keeps only the prefix before its last token (which is fed again). The copy ends where
        the last kept slot ends, so a single row keeps no masked slots (sliding windows stay exact)."""
        keep_until = [
            self._rows[r].slots[n - 2] + 1 if n >= 2 else 0 for r, n in zip(rows, prefix_lengths, strict=True)
        ]
        width = max(keep_until)
        index = torch.tensor(rows, dtype=torch.long, device=self._device)
        mask = self._mask[index, :width].clone()
        for k, (row, length) in enumerate(zip(rows, prefix_lengths, strict=True)):
            state = self._rows[row]
            kept = torch.zeros(width, dtype=torch.long, device=self._device)
            live = [slot for slot in state.slots[: max(length - 1, 0)] if slot < width]
            kept[live] = 1
            mask[k] *= kept
        layers = [(layer.keys[index, :, :width], layer.values[index, :, :width]) for layer in self._cache.layers]
        return DynamicCache(ddp_cache_data=layers), mask


@dataclass(frozen=True)
class ScoreRequest:
    """Candidates to score after the first `prefix_length` ids of `row`."""

    row: int
    prefix_length: int
    continuations: Sequence[Sequence[int]]
