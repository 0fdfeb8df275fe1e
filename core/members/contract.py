"""The member contract: everything a method may ask of a member, and nothing else.

A method never touches a model, a tokenizer or a KV cache. It talks to a member's *session*: the
member's state for a batch of requests (its cache, its token ids, where it stands in the
committed text). What crosses this interface is text (bytes), probabilities over ways to
continue the committed text, and small member-local indices; nothing in it depends on a torch
model, so a member hosted in another process (a Ray actor, a served model) can implement it.

Units and shapes:

* Text is bytes (UTF-8, possibly ending inside a character). The *committed text* is the
  prompt's reply so far, the shared state of a generation.
* A *continuation* is what a member could add after the committed text. A member asked for its
  next step answers with `Continuations`: a distribution over its candidate continuations.
  With prompt-boundary correction (docs/explanation/prompt-boundary.md) some candidates come from tokens that
  begin BEFORE the end of the committed text (Qwen at "...Gen" offers "er" from its token
  `Gener`); those are `PartialGroup`s. Without it, every candidate is a whole token.
* Probabilities are float32 tensors on the member's device; they sum to 1 over all candidates.
* Requests are named by stable `RequestId`s, never by row positions: a request keeps its id
  from start to finish whatever else in the batch ends.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NewType, Protocol, runtime_checkable

import numpy as np
import torch

if TYPE_CHECKING:
    from ensemble_core.vocab.tokens import TokenTable

RequestId = NewType("RequestId", int)
"""A request's handle for its whole life in a batch (unique within one generation call)."""


class ScoreKind(enum.Enum):
    """What `MemberSession.score` returns per candidate token."""

    LOGPROB = "logprob"  # log p(token | everything before it)
    LOGIT = "logit"  # the token's raw logit (SpecFuse's reference score)


class Boundary(enum.Enum):
    """How a member continues committed text that does not end at one of its token boundaries.

    CORRECT: the prompt-boundary-correct distribution (docs/explanation/prompt-boundary.md): the member conditions on
        a stable trunk of the text and sums over every way its tokenizer covers the rest.
    RETOKENIZE: the member re-encodes the text and predicts the next whole token (what wave 1
        did; kept for comparison).
    """

    CORRECT = "correct"
    RETOKENIZE = "retokenize"


@dataclass(frozen=True)
class PartialGroup:
    """Candidates from tokens that begin `skip` bytes before the end of the committed text.

    Every token in `token_ids` spells the last `skip` committed bytes and then more; as a
    candidate it adds `token_bytes[token][skip:]` (never empty).

    Attributes:
        skip: committed bytes each token re-covers (>= 1).
        token_ids: LongTensor [n], the member's ids.
        probs: float32 [n], each candidate's probability (path weight included).
        route: session-private: which covering path the tokens follow (used by `write`).
    """

    skip: int
    token_ids: torch.Tensor
    probs: torch.Tensor
    route: int = 0

    # Methods read a group through these wherever a few candidates decide (the greedy shortcut,
    # masses of other members' candidates): a member hosted elsewhere then sends the group's most
    # likely candidates and a bound on the rest (`members.wire`), and the whole group crosses
    # only when the full union is needed. A group built here knows every candidate.

    @property
    def complete(self) -> bool:
        """Every candidate is known here (`known()` is the whole group, `unknown_bound` is 0)."""
        return True

    def known(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, probabilities) of the candidates known without asking (all of them here)."""
        return self.token_ids, self.probs

    @property
    def unknown_bound(self) -> float:
        """The most probability any one candidate outside `known()` can have."""
        return 0.0

    @property
    def unknown_mass(self) -> float:
        """The probability of all candidates outside `known()` together."""
        return 0.0

    def token(self, index: int) -> int:
        """The id of the group's `index`-th candidate (what `Pick(g, index)` names)."""
        return int(self.token_ids[index])

    def prob(self, index: int) -> float:
        """The probability of the group's `index`-th candidate."""
        return float(self.probs[index])

    def probs_of(self, token_ids: Sequence[int]) -> list[float]:
        """The probability of each token as a candidate of this group (0.0 where it is not one)."""
        if not len(token_ids) or not len(self.token_ids):
            return [0.0] * len(token_ids)
        ids = self.token_ids.cpu().long()
        order = torch.argsort(ids)
        listed = ids[order]
        asked = torch.tensor(list(token_ids), dtype=torch.long)
        at = torch.searchsorted(listed, asked).clamp(max=len(listed) - 1)
        hit = listed[at] == asked
        found = self.probs.cpu().float()[order[at]]
        return torch.where(hit, found, torch.zeros_like(found)).tolist()


@dataclass(frozen=True)
class Continuations:
    """One member's next-step distribution over continuations of the committed text.

    Candidates are addressed by `Pick`s: `Pick(-1, v)` is the member's token `v` taken whole at
    the end of the committed text (it adds `token_bytes[v]`; an end-of-sequence id adds nothing
    and ends the text; a control token adds nothing and is not text); `Pick(g, k)` is the k-th
    token of `partial[g]`.

    Attributes:
        dense: float32 [logits width]: probability of each whole next token.
        partial: the candidates from tokens that re-cover committed bytes (empty when the
            committed text ends at a boundary the member trusts).
        origin: session-private: where in the member's state this was computed (`write` takes
            it back).
    """

    dense: torch.Tensor
    partial: tuple[PartialGroup, ...] = ()
    origin: Any = None
    greedy: Any = None
    """The member's own greedy choice (a `members.own_choice.Choice`) where whoever built this
    already made it: a hosted member's actor does, so the whole distribution need not cross."""
    host: tuple[tuple[np.ndarray, np.ndarray], ...] | None = field(default=None, compare=False, repr=False)
    """Every partial group's (ids, probabilities) as host data, where whoever built this had
    them (a covering computes its groups on the host and hands them to the device): then
    `host_groups` reads nothing."""

    @property
    def exact(self) -> bool:
        """Every candidate is a whole token at the end of the committed text."""
        return not self.partial

    # Methods read whole-token probabilities through these four, not through `dense`, wherever a
    # few entries decide (the greedy shortcut, masses of other members' candidates): a member
    # hosted elsewhere then sends its top entries and answers the rest on demand, and its whole
    # distribution crosses only when the full union is needed (sampling, the shortcut's fallback).

    @property
    def width(self) -> int:
        """How many whole-token ids there are (the logits width)."""
        return int(self.dense.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the whole-token probabilities are (and where `top`/`probs_at` answer)."""
        return self.dense.device

    def top(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities, ids) of the k most likely whole tokens (all when k >= width), most
        likely first, on the distribution's device."""
        found = torch.topk(self.dense, min(k, self.width))
        return found.values, found.indices

    def probs_at(self, ids: torch.Tensor) -> torch.Tensor:
        """The probabilities of whole tokens `ids` (LongTensor, on the distribution's device)."""
        return self.dense[ids]

    def total(self) -> float:
        """The probability of all whole tokens together (1 less the partial candidates')."""
        return float(self.dense.sum())

    def mass_extending(self, prefix: bytes, vocab: MemberVocab) -> float:
        """The probability of every candidate whose text starts with `prefix` (non-empty): whole
        tokens and partial candidates together (what SAFE's sharpening gives a word it is
        unsure how to split). Added exactly (`math.fsum`), so the member's host and a driver
        holding the whole distribution agree to the bit, and only the sum need cross a wire."""
        whole, partial = self.extending(prefix, vocab)
        return math.fsum(whole.tolist() + partial)

    def extending(self, prefix: bytes, vocab: MemberVocab) -> tuple[torch.Tensor, list[float]]:
        """The parts `mass_extending` adds up, not yet read: the whole tokens' probabilities (a
        tensor on the distribution's device) and the partial candidates' (host data), so a
        caller can read many at once."""
        table = vocab.table
        ids = table.ids_starting_with(prefix)
        ids = ids[(ids < self.width) & ~np.isin(ids, list(vocab.eos_ids))]
        whole = self.probs_at(torch.from_numpy(ids).to(self.device)).float()
        partial: list[float] = []
        for group, (known, probs) in zip(self.partial, self.host_groups(), strict=True):
            if len(known):  # every candidate of a group re-covers the same committed bytes
                head = (table.token_bytes[int(known[0])] or b"")[: group.skip]
                wanted = table.ids_starting_with(head + prefix)
                partial += group.probs_of(wanted.tolist()) if not group.complete else _probs_of(known, probs, wanted)
        return whole, partial

    def host_groups(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every partial group's known candidates as host data, (int64 ids, float32
        probabilities), read in ONE read for all groups and kept (a step's combination and the
        member's own choice both need them; read again only if a group became complete since)."""
        if self.host is not None:
            return list(self.host)
        state = tuple(group.complete for group in self.partial)
        memo = self.__dict__.get("_host_groups")
        if memo is None or memo[0] != state:
            known = [group.known() for group in self.partial]
            numbers = np.zeros(0)
            if known:
                pieces = [torch.cat([ids.double(), probs.double().to(ids.device)]) for ids, probs in known]
                numbers = torch.cat([piece.to(pieces[0].device) for piece in pieces]).numpy(force=True)
            found, at = [], 0
            for ids, _ in known:
                size = len(ids)
                pair = numbers[at : at + size].astype(np.int64), numbers[at + size : at + 2 * size].astype(np.float32)
                found.append(pair)
                at += 2 * size
            memo = (state, found)
            object.__setattr__(self, "_host_groups", memo)  # a frozen dataclass: a cache, not a field
        return memo[1]

    def on(self, device: torch.device) -> Continuations:
        """This distribution with its whole-token probabilities on `device` as float32 (moved once;
        the same object when they are there already)."""
        if self.dense.device == device and self.dense.dtype == torch.float32:
            return self
        return replace(self, dense=self.dense.to(device, torch.float32))


def _probs_of(ids: np.ndarray, probs: np.ndarray, wanted: np.ndarray) -> list[float]:
    """Each wanted id's probability among (ids, probs) (0.0 where it is not one), host data."""
    if not len(ids) or not len(wanted):
        return [0.0] * len(wanted)
    order = np.argsort(ids, kind="stable")
    listed = ids[order]
    at = np.searchsorted(listed, wanted).clip(max=len(listed) - 1)
    hit = listed[at] == wanted
    return np.where(hit, probs[order[at]].astype(np.float64), 0.0).tolist()


@dataclass(frozen=True)
class Pick:
    """One candidate of a `Continuations`: `group` -1 (a whole token) or a partial group, and
    `index` (the token id for -1, else the position in that group)."""

    group: int
    index: int


@dataclass(frozen=True)
class Candidate:
    """A continuation offered for scoring: `data` appended, then the end of the text if `eos`."""

    data: bytes
    eos: bool = False


@dataclass(frozen=True)
class CandidateScore:
    """A member's score of one candidate continuation.

    Attributes:
        values: float32 [n]: per token of the member's reading of the candidate, its log-prob
            (or raw logit); the first value also carries the boundary correction (minus the log
            mass of the committed remainder the reading re-covers), so `values.sum()` is
            log p(candidate | committed text) for log-probs.
        tokens: how many of those tokens reach into the candidate (the others only re-cover
            committed bytes); the mean is per candidate token. None: all of them.
    """

    values: torch.Tensor
    tokens: int | None = None

    @property
    def count(self) -> int:
        """How many tokens the mean is over."""
        return max(1, self.tokens if self.tokens else len(self.values))


def candidate_means(scores: Sequence[CandidateScore]) -> list[float]:
    """Each score's mean per candidate token, with ONE read per device for all of them (each
    sum taken where its values are, in float32, as `values.sum()` takes it)."""
    sums: list[float] = [0.0] * len(scores)
    by_device: dict[torch.device, list[int]] = {}
    for index, score in enumerate(scores):
        by_device.setdefault(score.values.device, []).append(index)
    for indices in by_device.values():
        read = torch.stack([scores[k].values.sum() for k in indices]).tolist()  # the one read
        for k, value in zip(indices, read, strict=True):
            sums[k] = value
    return [total / score.count for total, score in zip(sums, scores, strict=True)]


@dataclass
class SessionStats:
    """What one member's session did (for a whole batch).

    Attributes:
        forwards / forward_seconds / forwarded_tokens: model forward passes, wall seconds inside
            them, and positions fed through the model (padding included).
        own_tokens: tokens kept because the member wrote them itself (no re-encoding).
        reencoded_tokens: tokens taken from encoding committed text it did not write.
        rollbacks: times committed text disagreed with ids it had already forwarded.
        sat_out: steps in which it could not take part (it cannot spell the committed text).
        unspellable: commits that brought bytes it has no tokens for (it sits out from there).
    """

    forwards: int = 0
    forward_seconds: float = 0.0
    forwarded_tokens: int = 0
    own_tokens: int = 0
    reencoded_tokens: int = 0
    rollbacks: int = 0
    sat_out: int = 0
    unspellable: int = 0


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt as one member will read it.

    Attributes:
        ids: the member's prompt ids (template, BOS, reply prefix included).
        fixed: how many leading ids never change (up to the last special token of a raw prompt;
            the whole generation prompt of a chat template); the rest may be re-tokenised
            together with the reply when prompt-boundary correction is on.
        lead: bytes the member expects before the reply (a template's separator, e.g. the
            space Llama-2's template writes after `[/INST]`); the member's first token spells
            them, and they are not part of the committed text.
    """

    ids: list[int]
    fixed: int
    lead: bytes = b""


@dataclass(frozen=True)
class DraftReading:
    """A member's distributions at the piece boundaries of a draft it did not write.

    Attributes:
        at: per boundary j (after the first j pieces), the member's `Continuations` there, or
            None where it has none (without boundary correction: the boundary falls inside one
            of its tokens, "OOV-like"; or it cannot spell the text).
        written: how many leading pieces the reading took as written by the member itself (its
            distributions after them assume it will keep those pieces as its own tokens); if it
            then does not write piece j < written, the rest must be read again.
    """

    at: list[Continuations | None] = field(default_factory=list)
    written: int = 0


@runtime_checkable
class MemberSession(Protocol):
    """One member's state for a batch of requests; the ONLY thing methods touch.

    Lifecycle: `Member.start` opens it for some requests; the decode loop calls `commit` for every
    request after every step and `drop` when requests end. Between commits a method may ask for
    distributions (`next`), let the member write its own choices ahead of the committed text
    (`write`: drafts, or the member's own pick that the method is about to commit), read a draft
    written by another member (`read`), and score candidate continuations (`score`). Each of
    `next`, `read` and `score` costs at most ONE forward of the model for all requests given.
    """

    def next(self, requests: Sequence[RequestId], temperature: float = 1.0) -> list[Continuations | None]:
        """Distributions after each request's committed text and what the member wrote since.

        Args:
            temperature: each token distribution is softmax(logits / temperature); 1 for greedy.

        Returns:
            Per request, its `Continuations`, or None while the member sits out (it cannot spell
            the committed text).
        """
        ...

    def write(self, request: RequestId, continuations: Continuations, pick: Pick) -> bool:
        """The member writes one of its own candidates (from `continuations`, which must come
        from its latest `next`, or from a `read` at the point it has written up to).

        Written text lies ahead of the committed text until `commit`; the member keeps the
        tokens of everything written that the commit confirms. Returns False (and writes
        nothing) when the candidate does not continue what the member has written.
        """
        ...

    def read(
        self,
        requests: Sequence[RequestId],
        drafts: Sequence[Sequence[bytes]],
        temperature: float = 1.0,
        written: Sequence[int] | None = None,
    ) -> list[DraftReading]:
        """Distributions at every piece boundary of a draft (pieces appended to the committed
        text), for all requests in ONE forward.

        Args:
            drafts: per request, the draft's pieces (the drafter's tokens' bytes).
            written: per request, how many leading pieces to read as if the member had
                written them itself wherever it can (default: all); the rest it reads as text
                it did not write.
        """
        ...

    def score(
        self,
        requests: Sequence[RequestId],
        candidates: Sequence[Sequence[Candidate]],
        kind: ScoreKind = ScoreKind.LOGPROB,
    ) -> list[list[CandidateScore]]:
        """Score every candidate continuation of every request in ONE forward (what the member
        wrote itself is read as it wrote it)."""
        ...

    def commit(self, request: RequestId, data: bytes) -> None:
        """`data` is appended to the request's committed text: keep what it wrote as far as the
        data confirms it, and bring the rest in step."""
        ...

    def drop(self, requests: Sequence[RequestId]) -> None:
        """These requests ended: free their rows."""
        ...

    def admit(self, prompts: Mapping[RequestId, RenderedPrompt]) -> None:
        """New requests join the running batch (continuous batching): from the next `next`,
        `read` or `score` on they are asked for like the others; nothing is forwarded here."""
        ...

    def lagging(self, request: RequestId) -> bool:
        """Whether the member cannot take part now (it cannot spell the committed text)."""
        ...

    def token_ids(self, request: RequestId) -> list[int]:
        """The member's own ids for the request's committed text (the reply part)."""
        ...

    def prompt_tokens(self, request: RequestId) -> int:
        """How many ids the member's prompt had."""
        ...

    def stats(self) -> SessionStats:
        """Totals over the whole batch since the session started."""
        ...


@dataclass(frozen=True)
class MemberVocab:
    """The static facts about a member a method may use (no model, no tokenizer object).

    Attributes:
        name: the member's unique name.
        table: bytes and kinds of its token ids.
        eos_ids: ids that end a sequence.
        width: its logits width (may exceed the table: Qwen's padded head).
        device: where its distributions live.
        encode: the member's ids spelling exactly some bytes (None: it cannot spell them).
    """

    name: str
    table: TokenTable
    eos_ids: frozenset[int]
    width: int
    device: torch.device
    encode: Callable[[bytes], list[int] | None] = field(default=lambda data: None, compare=False, repr=False)

    def text_of(self, token: int) -> bytes | None:
        """The bytes a whole token adds (None: a control token, or an id past the table)."""
        return self.table.token_bytes[token] if 0 <= token < len(self.table) else None
