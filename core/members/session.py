"""`TreeSession`: the member contract (`contract.MemberSession`) over a token trie.

One implementation serves every member that evaluates token ids: `HFMember` (a Hugging Face
model over a KV cache) and `testing.FakeMember` (a logits function). Per request it keeps:

* the *history*: the member's ids it keeps (prompt, then the reply), the trie's head chain;
* the *target*: the bytes the history must eventually spell after its fixed prompt ids (the
  prompt's re-tokenisable tail, the template's lead, then the committed text);
* what the member *wrote* ahead of the committed text (its drafts, or a pick the method is
  about to commit): a chain below the head that `commit` keeps as far as the data confirms it.

How the member continues text it did not write is its `Boundary` mode: `RetokenizeMode`
(re-encode the text and predict the next whole token) or `CoveringMode` (prompt-boundary
correction, `covering.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ensemble_core.errors import EnsembleWarning
from ensemble_core.members.contract import (
    Boundary,
    Candidate,
    CandidateScore,
    Continuations,
    DraftReading,
    MemberVocab,
    Pick,
    RenderedPrompt,
    RequestId,
    ScoreKind,
    SessionStats,
)
from ensemble_core.members.encoding import ExactEncoder
from ensemble_core.members.token_tree import Node, TokenTree
from ensemble_core.sampling import tempered
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

if TYPE_CHECKING:
    from ensemble_core.members.covering import Covering

DEFAULT_TAIL_TOKENS = 4


@dataclass(frozen=True)
class Origin:
    """Where a `Continuations` was computed: the request, the node whose next token it is about,
    and how many bytes past the committed text that node's text ends (plus, for a covering,
    the covering itself)."""

    request: RequestId
    node: Node
    offset: int
    covering: Covering | None = None


@dataclass(eq=False)
class RequestState:
    """One request as this member sees it (see the module docstring)."""

    key: RequestId
    prompt_ids: list[int]
    fixed: int
    target: bytearray
    spelled: int = 0
    written: list[Node] = field(default_factory=list)
    written_text: bytes = b""
    kept_until: int = 0  # history length after the last commit's own tokens (re-encoding starts after)
    own_head: bool = False  # the history ends with a token the member wrote itself
    stuck: bool = False  # the committed text has bytes this member cannot spell: it sits out for good

    @property
    def unspelled(self) -> bytes:
        """Target bytes the history does not spell yet."""
        return bytes(self.target[self.spelled :])


class TreeSession:
    """A member's session (`contract.MemberSession`) over a `TokenTree`.

    Args:
        vocab: the member's static facts.
        tree: the trie of its requests (prompts placed, nothing evaluated).
        prompts: the rendered prompts, per request.
        encoder: its exact encoder.
        boundary: how it continues text it did not write.
        end_id: the id it appends to a candidate that ends the text.
        tail_tokens: retokenize mode: how many of its last ids are re-encoded with new text.
    """

    def __init__(
        self,
        vocab: MemberVocab,
        tree: TokenTree,
        prompts: dict[RequestId, RenderedPrompt],
        encoder: ExactEncoder,
        boundary: Boundary,
        end_id: int,
        tail_tokens: int = DEFAULT_TAIL_TOKENS,
        tokenizer: object | None = None,
    ):
        self.vocab = vocab
        self.tree = tree
        self.encoder = encoder
        self.end_id = end_id
        self._counts = SessionStats()
        self._warned = False
        self._states: dict[RequestId, RequestState] = {}
        self.boundary = boundary
        if boundary is Boundary.CORRECT:
            from ensemble_core.members.covering import CoveringMode

            self.mode: Mode = CoveringMode(self, tokenizer)  # type: ignore[assignment]
        else:
            self.mode = RetokenizeMode(self, tail_tokens)
        self._place(prompts)

    def admit(self, prompts: Mapping[RequestId, RenderedPrompt]) -> None:
        self.tree.add({key: prompt.ids for key, prompt in prompts.items()})
        self._place(prompts)

    def _place(self, prompts: Mapping[RequestId, RenderedPrompt]) -> None:
        for key, prompt in prompts.items():
            fixed = self.mode.fixed_prefix(prompt)
            tail = self.vocab.table.spell(prompt.ids[fixed:])
            state = RequestState(key, list(prompt.ids), fixed, bytearray(tail + prompt.lead), spelled=len(tail))
            state.kept_until = len(prompt.ids)
            self._states[key] = state
            self.mode.start(state)

    # ------------------------------------------------------------------ contract: reading

    def next(self, requests: Sequence[RequestId], temperature: float = 1.0) -> list[Continuations | None]:
        plans = []
        for key in requests:
            state = self._states[key]
            plans.append(None if self.lagging(key) else self.mode.plan_next(state))
        self.tree.evaluate()
        out: list[Continuations | None] = []
        for key, plan in zip(requests, plans, strict=True):
            if plan is None:
                self._counts.sat_out += 1
                out.append(None)
            else:
                out.append(self.mode.finish(self._states[key], plan, temperature))
        return out

    def read(
        self,
        requests: Sequence[RequestId],
        drafts: Sequence[Sequence[bytes]],
        temperature: float = 1.0,
        written: Sequence[int] | None = None,
    ) -> list[DraftReading]:
        plans = []
        for k, (key, pieces) in enumerate(zip(requests, drafts, strict=True)):
            state = self._states[key]
            if state.stuck:
                plans.append(None)
                continue
            adopt = len(pieces) if written is None else written[k]
            plans.append(self.mode.plan_read(state, list(pieces), adopt))
        self.tree.evaluate()
        readings = []
        for key, pieces, plan in zip(requests, drafts, plans, strict=True):
            if plan is None:
                readings.append(DraftReading([None] * (len(pieces) + 1)))
            else:
                found, written_pieces = self.mode.finish_read(self._states[key], plan, temperature)
                readings.append(DraftReading(found, written_pieces))
        return readings

    def score(
        self,
        requests: Sequence[RequestId],
        candidates: Sequence[Sequence[Candidate]],
        kind: ScoreKind = ScoreKind.LOGPROB,
    ) -> list[list[CandidateScore]]:
        plans = []
        for key, found in zip(requests, candidates, strict=True):
            state = self._states[key]
            plans.append([self.mode.plan_score(state, candidate) for candidate in found])
        self.tree.evaluate()
        results = []
        for key, per_request in zip(requests, plans, strict=True):
            state = self._states[key]
            results.append([self.mode.finish_score(state, plan, kind) for plan in per_request])
        return results

    # ------------------------------------------------------------------ contract: writing

    def write(self, request: RequestId, continuations: Continuations, pick: Pick) -> bool:
        state = self._states[request]
        origin = continuations.origin
        if not isinstance(origin, Origin) or origin.request != request:
            raise RuntimeError("`write` needs Continuations this session gave for this request")
        if state.stuck:
            return False
        return self.mode.write(state, origin, pick)

    def writing_node(self, state: RequestState) -> Node:
        """Where the member's next written token goes: after what it wrote, else its history."""
        return state.written[-1] if state.written else self.tree.head(state.key)

    def writing_offset(self, state: RequestState) -> int:
        """Bytes past the committed text that history + written spell (negative: behind it)."""
        return state.spelled + len(state.written_text) - len(state.target)

    def append_written(self, state: RequestState, tokens: Sequence[int]) -> None:
        node = self.writing_node(state)
        for token in tokens:
            node = self.tree.child(node, token)
            state.written.append(node)
            state.written_text += self.vocab.text_of(token) or b""

    def commit(self, request: RequestId, data: bytes) -> None:
        state = self._states[request]
        state.target += data
        if state.stuck:
            state.written, state.written_text = [], b""
            return
        kept = self._keep_written(state)
        self.mode.sync(state, kept)
        state.written, state.written_text = [], b""
        self.tree.prune(request, self.mode.nodes_to_keep(state))

    def _keep_written(self, state: RequestState) -> int:
        """Keep the written tokens the committed text confirms (and the control tokens among
        them, which spell nothing); returns how many."""
        unspelled = state.unspelled
        kept, size = 0, 0
        for node in state.written:
            piece = self.vocab.table.token_bytes[node.token] or b""
            # A written control token (`<|im_start|>` chosen by a member decoding alone) spells
            # nothing: the member keeps it, as `generate` would, and goes on after it.
            if piece and not unspelled.startswith(piece, size):
                break
            size += len(piece)
            kept += 1
        if kept:
            self.tree.set_head(state.key, state.written[kept - 1])
            state.spelled += size
            state.kept_until = len(self.tree.row(state.key).history)
            state.own_head = True
            self._counts.own_tokens += kept
        return kept

    def drop(self, requests: Sequence[RequestId]) -> None:
        gone = [key for key in requests if key in self._states]
        for key in gone:
            del self._states[key]
        if gone:
            self.tree.drop(gone)

    # ------------------------------------------------------------------ contract: facts

    def lagging(self, request: RequestId) -> bool:
        state = self._states[request]
        return state.stuck or self.mode.lagging(state)

    def token_ids(self, request: RequestId) -> list[int]:
        """The member's ids for the reply: its history past the prompt ids it still holds, then
        its own spelling of committed bytes it has not tokenised yet (the unstable end, with
        boundary correction; nothing more is coming when this is asked at the end)."""
        state = self._states[request]
        rest = self.encoder.encode(state.unspelled) if state.unspelled and not state.stuck else []
        ids = [n.token for n in self.tree.row(request).history] + (rest or [])
        same = 0
        while same < min(len(ids), len(state.prompt_ids)) and ids[same] == state.prompt_ids[same]:
            same += 1
        return ids[same:]

    def prompt_tokens(self, request: RequestId) -> int:
        return len(self._states[request].prompt_ids)

    def stats(self) -> SessionStats:
        counts = self._counts
        return SessionStats(
            forwards=self.tree.stats.forwards,
            forward_seconds=self.tree.stats.seconds,
            forwarded_tokens=self.tree.stats.tokens,
            own_tokens=counts.own_tokens,
            reencoded_tokens=counts.reencoded_tokens,
            rollbacks=counts.rollbacks,
            sat_out=counts.sat_out,
            unspellable=counts.unspellable,
        )

    # ------------------------------------------------------------------ helpers for the modes

    def state(self, request: RequestId) -> RequestState:
        return self._states[request]

    def mark_stuck(self, state: RequestState, data: bytes) -> None:
        """The member cannot spell `data`: it sits out for the rest of this request (warned once)."""
        state.stuck = True
        self._counts.unspellable += 1
        if not self._warned:
            self._warned = True
            shown = data[:40]
            warnings.warn(
                f"Member {self.vocab.name!r} cannot spell the committed text {shown!r} with its tokens (its "
                "vocabulary lacks some of these bytes, or its normaliser changes them); it sits out the rest "
                "of this reply instead of continuing from a different text. See `result.stats.members`.",
                EnsembleWarning,
                stacklevel=4,
            )

    def count_reencoded(self, tokens: int, rolled_back: bool) -> None:
        self._counts.reencoded_tokens += tokens
        self._counts.rollbacks += int(rolled_back)

    def dense(self, node: Node, temperature: float) -> torch.Tensor:
        """softmax(logits / temperature) after `node`, float32 [width]."""
        if node.logits is None:
            raise RuntimeError("the node's logits were not computed")
        return torch.softmax(tempered(node.logits.float(), temperature), dim=-1)

    def token_text(self, token: int) -> bytes | None:
        return self.vocab.text_of(token)


class Mode:
    """How a session continues text its member did not write (see `Boundary`)."""

    def fixed_prefix(self, prompt: RenderedPrompt) -> int:
        """How many prompt ids never change."""
        raise NotImplementedError

    def start(self, state: RequestState) -> None:
        """Bring a fresh request in step with its lead bytes."""
        raise NotImplementedError

    def lagging(self, state: RequestState) -> bool:
        raise NotImplementedError

    def plan_next(self, state: RequestState):
        raise NotImplementedError

    def finish(self, state: RequestState, plan, temperature: float) -> Continuations:
        raise NotImplementedError

    def plan_read(self, state: RequestState, pieces: list[bytes], adopt: int):
        raise NotImplementedError

    def finish_read(self, state: RequestState, plan, temperature: float) -> tuple[list[Continuations | None], int]:
        """The distributions at each piece boundary, and how many pieces were read as written."""
        raise NotImplementedError

    def plan_score(self, state: RequestState, candidate: Candidate):
        raise NotImplementedError

    def finish_score(self, state: RequestState, plan, kind: ScoreKind) -> CandidateScore:
        raise NotImplementedError

    def write(self, state: RequestState, origin: Origin, pick: Pick) -> bool:
        raise NotImplementedError

    def sync(self, state: RequestState, kept: int) -> None:
        raise NotImplementedError

    def nodes_to_keep(self, state: RequestState) -> Sequence[Node]:
        return ()


@dataclass(frozen=True)
class _ScorePlan:
    nodes: list[Node]  # the candidate's nodes, below `parent`
    parent: Node
    correction: float = 0.0  # minus the log mass of the re-covered committed remainder
    missing: bool = False


class RetokenizeMode(Mode):
    """Re-encode committed text the member did not write and predict the next whole token.

    The member keeps its prompt ids as they are; committed text it did not write is encoded
    together with its last few ids (never reaching back before ids it wrote itself in the
    latest commit), the common prefix with the ids it has keeps its cache, and the rest is
    appended. Bytes ending inside a character are spelled with byte tokens where the
    vocabulary has them, else held back (the member sits out) until the character completes.
    """

    def __init__(self, session: TreeSession, tail_tokens: int):
        self.session = session
        self.tail = tail_tokens

    def fixed_prefix(self, prompt: RenderedPrompt) -> int:
        return len(prompt.ids)

    def start(self, state: RequestState) -> None:
        if state.unspelled:
            self.sync(state, 0)

    def lagging(self, state: RequestState) -> bool:
        return bool(state.unspelled)

    # -- next

    def plan_next(self, state: RequestState) -> Node:
        node = state.written[-1] if state.written else self.session.tree.head(state.key)
        self.session.tree.want(node)
        return node

    def finish(self, state: RequestState, plan: Node, temperature: float) -> Continuations:
        offset = len(state.written_text)
        return Continuations(self.session.dense(plan, temperature), origin=Origin(state.key, plan, offset))

    def write(self, state: RequestState, origin: Origin, pick: Pick) -> bool:
        session = self.session
        if pick.group != -1 or origin.offset != session.writing_offset(state):
            return False
        if pick.index in session.vocab.eos_ids:
            return False  # the end is committed as the end, never written
        session.append_written(state, [pick.index])  # a control token too: it is kept, spelling nothing
        return True

    # -- read

    def plan_read(self, state: RequestState, pieces: list[bytes], adopt: int):
        session = self.session
        offsets = piece_offsets(pieces)
        start = reading_start(session, state, offsets)
        if start is None:
            return [(None, offset) for offset in offsets]
        held = b"" if state.written else state.unspelled
        ids = session.encoder.encode(held + b"".join(pieces[start:]))
        if ids is None:
            return [(None, offset) for offset in offsets]
        base = session.writing_node(state)
        boundaries: dict[int, Node] = {} if held else {offsets[start]: base}
        node, position = base, offsets[start] - len(held)
        for token in ids:
            node = session.tree.child(node, token)
            position += len(session.token_text(token) or b"")
            if position >= offsets[start]:
                boundaries[position] = node
        found = [boundaries.get(offset) if j >= start else None for j, offset in enumerate(offsets)]
        for node in found:
            if node is not None:
                session.tree.want(node)
        return list(zip(found, offsets, strict=True))

    def finish_read(self, state: RequestState, plan, temperature: float) -> tuple[list[Continuations | None], int]:
        out: list[Continuations | None] = []
        for node, offset in plan:
            if node is None:
                out.append(None)
            else:
                origin = Origin(state.key, node, offset)
                out.append(Continuations(self.session.dense(node, temperature), origin=origin))
        return out, 0

    # -- score

    def plan_score(self, state: RequestState, candidate: Candidate) -> _ScorePlan:
        session = self.session
        head = session.tree.head(state.key)
        if state.written and state.written_text == candidate.data:
            ids = [n.token for n in state.written]
        else:
            encoded = session.encoder.encode(state.unspelled + candidate.data) if candidate.data else []
            if encoded is None:
                return _ScorePlan([], head, missing=True)
            ids = encoded
        if candidate.eos:
            ids = [*ids, session.end_id]
        nodes = []
        node = head
        session.tree.want(head)
        for token in ids:
            node = session.tree.child(node, token)
            nodes.append(node)
        for node in nodes[:-1]:
            session.tree.want(node)
        return _ScorePlan(nodes, head)

    def finish_score(self, state: RequestState, plan: _ScorePlan, kind: ScoreKind) -> CandidateScore:
        return score_chain(plan, kind)

    # -- commit

    def sync(self, state: RequestState, kept: int) -> None:
        session = self.session
        unspelled = state.unspelled
        if not unspelled:
            return
        partial = incomplete_utf8_suffix(bytes(state.target))
        if partial and not session.encoder.can_spell_bytes(bytes(state.target[-partial:])):
            unspelled = unspelled[: max(0, len(unspelled) - partial)]  # held until the character completes
            if not unspelled:
                return
        tree = session.tree
        row = tree.row(state.key)
        history = row.history
        start = self._tail_start(state, history)
        base = history[start - 1]
        spelled_from = state.spelled - len(session.vocab.table.spell([n.token for n in history[start:]]))
        target = bytes(state.target[spelled_from : state.spelled]) + unspelled
        fresh = session.encoder.encode(target)
        if fresh is None:
            session.mark_stuck(state, unspelled)
            return
        old_head = row.head
        node = tree.path(base, fresh)
        was_ancestor = _descends_from(node, old_head)
        common = 0
        while common < min(len(fresh), len(history) - start) and history[start + common].token == fresh[common]:
            common += 1
        tree.set_head(state.key, node)
        state.spelled = spelled_from + len(target)
        session.count_reencoded(len(fresh) - common, rolled_back=not was_ancestor)

    def _tail_start(self, state: RequestState, history: list[Node]) -> int:
        """The history index where re-encoding starts: `tail` ids back, but never before the ids
        the member wrote itself in the latest commit, nor into its prompt, and never inside a
        character."""
        floor = max(state.fixed, state.kept_until)
        start = len(history)
        target = bytes(state.target)
        offset = state.spelled
        table = self.session.vocab.table
        while start > floor and (len(history) - start < self.tail or _is_continuation(target, offset)):
            start -= 1
            offset -= len(table.token_bytes[history[start].token] or b"")
        return start


def piece_offsets(pieces: Sequence[bytes]) -> list[int]:
    """Byte offsets (past the committed text) of every piece boundary of a draft."""
    offsets = [0]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    return offsets


def reading_start(session: TreeSession, state: RequestState, offsets: list[int]) -> int | None:
    """The first piece boundary at or after what the member has written (None: its writing
    ends inside a piece, so no boundary of the draft is its own)."""
    written = max(0, session.writing_offset(state))
    return offsets.index(written) if written in offsets else None


def score_chain(plan: _ScorePlan, kind: ScoreKind) -> CandidateScore:
    """Per-token log-probs (or raw logits) of a candidate's nodes under their parents' logits,
    on the logits' device and not read (`candidate_means` reads a round's scores together)."""
    if plan.missing or not plan.nodes:
        return CandidateScore(torch.tensor([float("-inf")]))
    values = []
    parent = plan.parent
    for node in plan.nodes:
        if kind is ScoreKind.LOGIT:
            values.append(parent.logits[node.token].float())  # type: ignore[index]
        else:
            values.append(parent.logprob(node.token))
        parent = node
    tensor = torch.stack(values)
    if plan.correction:
        tensor[0] += plan.correction
    return CandidateScore(tensor)


def _descends_from(node: Node, ancestor: Node) -> bool:
    """Whether `ancestor` is `node` or one of its ancestors (walking up only to its depth)."""
    current: Node | None = node
    while current is not None and current.depth > ancestor.depth:
        current = current.parent
    return current is ancestor


def _is_continuation(data: bytes, offset: int) -> bool:
    return 0 <= offset < len(data) and data[offset] & 0xC0 == 0x80
