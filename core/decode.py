"""The decode loop every method runs in: commits -> text, stop strings, limits, member sync.

Every prompt becomes a request with a stable `RequestId`. Members' sessions and the method's
run key all per-request state by it, so when one request ends (and its rows are freed) no
other request inherits anything of it, and a request admitted into a running batch
(`DecodeLoop.admit`, continuous batching) starts from nothing of anyone else's; both learn of
ended requests through one hook, `DecodeLoop._retire`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.members.base import Member
from ensemble_core.members.contract import Boundary, MemberSession, RenderedPrompt, RequestId, SessionStats
from ensemble_core.members.lanes import Lanes
from ensemble_core.methods.base import Binding, Commit, DecodeState, MethodRun
from ensemble_core.results import (
    FinishReason,
    GenerationResult,
    GenerationStats,
    MemberStats,
    MemberUsage,
    StreamChunk,
    Usage,
)
from ensemble_core.sampling import row_generator
from ensemble_core.text_buffer import TextBuffer

_REQUEST_IDS = itertools.count(1)


@dataclass
class _Active:
    """One prompt being generated."""

    request: RequestId
    index: int  # the prompt's position in the call that admitted it
    text: TextBuffer
    limit: int  # its max_new_tokens
    started: float
    since: dict[int, SessionStats]  # the sessions' totals when it joined (its stats are what came after)
    steps: int = 0
    constraint: Any = None  # its ConstraintState, if its reply is constrained


def batch_key(settings: GenerationSettings) -> tuple:
    """What requests must share to run in one batch: methods read the sampling rule and the
    stop strings from the batch's settings; the token limit and the seed are per request."""
    return (settings.temperature, settings.top_p, settings.stop)


class DecodeLoop:
    """One running batch: requests join it (`admit`) and leave it (finished, or `cancel`) at
    step boundaries, so a server can batch requests that arrive while others generate.

    Args:
        members: every member of the ensemble.
        binding: the method bound to them.
        settings: the batch's settings (every admitted request must share its `batch_key`).
        boundary: how members continue text they did not write.
        device: where the method combines distributions.
        lanes: where each member's work runs (`members.lanes`; None: all in this thread).
    """

    def __init__(
        self,
        members: Sequence[Member],
        binding: Binding,
        settings: GenerationSettings,
        boundary: Boundary,
        device: torch.device,
        lanes: Lanes | None = None,
    ):
        self._members = members
        self._binding = binding
        self.settings = settings
        self._boundary = boundary
        self._lanes = lanes or Lanes()
        self._sessions: dict[int, MemberSession] = {}
        self._active: list[_Active] = []
        self._state = DecodeState(
            members=binding.members,
            sessions=self._sessions,
            settings=settings,
            requests=[],
            generators={},
            tails={},
            device=device,
            weights={},
            lanes=self._lanes,
        )
        self._run = binding.start(settings, device)

    @property
    def requests(self) -> list[RequestId]:
        """The requests still generating, in admission order."""
        return [a.request for a in self._active]

    def admit(
        self,
        prompts: dict[int, list[RenderedPrompt]],
        settings: Sequence[GenerationSettings] | None = None,
        weights: Sequence[tuple[float, ...]] | None = None,
    ) -> list[RequestId]:
        """New requests join at the next step (their prompts are forwarded with it).

        Args:
            prompts: member index -> its rendered prompt per new request (participants only).
            settings: per new request, its settings (default: the batch's); each must share
                the batch's `batch_key`.
            weights: per new request, member weights found before generating (else the binding's).

        Returns:
            The new requests' handles, in the order given.
        """
        count = len(next(iter(prompts.values())))
        per_request = list(settings) if settings is not None else [self.settings] * count
        for one in per_request:
            if batch_key(one) != batch_key(self.settings):
                raise ValueError("a request joins only a batch with the same temperature, top_p and stop")
        requests = [RequestId(next(_REQUEST_IDS)) for _ in range(count)]
        joined: list[MemberSession] = []
        try:
            for m, rendered in prompts.items():
                given = dict(zip(requests, rendered, strict=True))
                if m in self._sessions:
                    self._sessions[m].admit(given)
                else:
                    self._sessions[m] = self._lanes.session(m, self._members[m].start(given, self._boundary))
                joined.append(self._sessions[m])
        except BaseException:  # no member keeps rows of requests that never joined
            for session in joined:
                session.drop(requests)
            raise
        now = time.perf_counter()
        since = {m: session.stats() for m, session in self._sessions.items()}
        for index, (request, one) in enumerate(zip(requests, per_request, strict=True)):
            item = _Active(request, index, TextBuffer(self.settings.stop), one.max_new_tokens, now, since)
            self._active.append(item)
            self._state.generators[request] = row_generator(one)
            self._state.tails[request] = item.text.tail
            if one.constraint is not None:
                self._state.constraints[request] = item.constraint = self._run.constrain(one.constraint)
        if weights is not None:
            self._state.weights.update(zip(requests, weights, strict=True))
        return requests

    def step(self) -> list[tuple[RequestId, StreamChunk]]:
        """One step of every active request: the text each made final, and for those that
        ended, their last chunk (with `finish_reason` and `result`); ended requests leave."""
        if not self._active:
            return []
        state = self._state
        # what a grammar forces is committed as it stands: no member need decide it, and it
        # costs no tokens of `max_new_tokens` (as a reply prefix would not)
        forced = {a.request: a.constraint.forced() for a in self._active if a.constraint is not None}
        forced = {request: text for request, text in forced.items() if text}
        state.requests = [r for r in self.requests if r not in forced]
        state.remaining = {a.request: a.limit - a.steps for a in self._active}
        commits = self._run.step(state) if state.requests else {}
        commits.update({request: Commit(text=text, tokens=0) for request, text in forced.items()})
        out: list[tuple[RequestId, StreamChunk]] = []
        finished: list[_Active] = []
        for item in self._active:
            commit = commits[item.request]
            reason = _apply(item, commit)
            for session in self._sessions.values():
                session.commit(item.request, commit.text)
            piece = item.text.take_new_text(final=reason is not None)
            if reason is None:
                if piece:
                    out.append((item.request, StreamChunk(text=piece, index=item.index)))
                continue
            finished.append(item)
            result = _result(self._members, self._binding, self._sessions, self._run, item, reason)
            out.append((item.request, StreamChunk(text=piece, index=item.index, finish_reason=reason, result=result)))
        if finished:
            self._retire([f.request for f in finished])
        return out

    def cancel(self, requests: Sequence[RequestId]) -> None:
        """These requests end now, without results (a client went away, a deadline passed)."""
        gone = set(requests)
        leaving = [a.request for a in self._active if a.request in gone]
        if leaving:
            self._retire(leaving)

    def close(self) -> None:
        """Free what every unfinished request holds."""
        self.cancel(self.requests)

    def _retire(self, requests: list[RequestId]) -> None:
        """The one hook through which the method and every member learn that requests ended."""
        self._run.drop(requests)
        for session in self._sessions.values():
            session.drop(requests)
        self._state.forget(requests)
        gone = set(requests)
        self._active = [a for a in self._active if a.request not in gone]


def decode(
    members: Sequence[Member],
    binding: Binding,
    prompts: dict[int, list[RenderedPrompt]],
    settings: GenerationSettings,
    boundary: Boundary,
    device: torch.device,
    cancel: threading.Event | None = None,
    weights: Sequence[tuple[float, ...]] | None = None,
    lanes: Lanes | None = None,
) -> Iterator[StreamChunk]:
    """Generate for every prompt at once (one `DecodeLoop`, no later arrivals); yields text as
    it becomes final, per prompt index.

    Args:
        prompts: member index -> its rendered prompt per prompt (participants only).
        cancel: once set, generation ends after the current step, without results.
        weights: per prompt, member weights found before generating (else the binding's).
        Others: as for `DecodeLoop`.

    Yields:
        `StreamChunk`s; each prompt's last one has `finish_reason` and `result`.
    """
    loop = DecodeLoop(members, binding, settings, boundary, device, lanes)
    try:
        loop.admit(prompts, weights=weights)
        while loop.requests:
            if cancel is not None and cancel.is_set():
                return
            for _, chunk in loop.step():
                yield chunk
    finally:  # cancelled, closed or failed: free what the unfinished requests hold
        loop.close()


def _apply(item: _Active, commit: Commit) -> FinishReason | None:
    item.steps += commit.tokens
    if item.constraint is not None:
        item.constraint.advance(commit.text)
    if item.text.append(commit.text):
        return "stop"
    if commit.eos:
        return "eos"
    if item.constraint is not None and item.constraint.finished:
        return "stop"  # the grammar is complete: nothing more may be written
    if item.steps >= item.limit:
        return "length"
    return None


def _result(
    members: Sequence[Member],
    binding: Binding,
    sessions: dict[int, MemberSession],
    run: MethodRun,
    item: _Active,
    reason: FinishReason,
) -> GenerationResult:
    usage = _usage(members, binding, sessions, item.request, reason)
    stats = GenerationStats(
        method=binding.method.name,
        steps=item.steps,
        wall_seconds=time.perf_counter() - item.started,
        members=_member_stats(members, sessions, item.since),
        method_stats=run.stats(item.request),
    )
    token_ids = {members[m].name: session.token_ids(item.request) for m, session in sessions.items()}
    return GenerationResult(item.text.text(), reason, usage, stats, bytes(item.text.data), token_ids)


def _usage(
    members: Sequence[Member],
    binding: Binding,
    sessions: dict[int, MemberSession],
    request: RequestId,
    reason: FinishReason,
) -> Usage:
    eos = 1 if reason == "eos" else 0
    per_member = {
        members[m].name: MemberUsage(
            prompt_tokens=session.prompt_tokens(request),
            completion_tokens=len(session.token_ids(request)) + eos,
        )
        for m, session in sessions.items()
    }
    reference = members[binding.reference].name
    headline = per_member[reference]
    return Usage(headline.prompt_tokens, headline.completion_tokens, reference, per_member)


def _member_stats(
    members: Sequence[Member], sessions: dict[int, MemberSession], since: dict[int, SessionStats]
) -> dict[str, MemberStats]:
    """Each member's work while the request ran (the whole batch's, from the request's admission)."""
    found = {}
    for m, session in sessions.items():
        totals = _difference(session.stats(), since.get(m, SessionStats()))
        found[members[m].name] = MemberStats(
            forwards=totals.forwards,
            forward_seconds=totals.forward_seconds,
            forwarded_tokens=totals.forwarded_tokens,
            own_tokens=totals.own_tokens,
            reencoded_tokens=totals.reencoded_tokens,
            rollbacks=totals.rollbacks,
            sat_out=totals.sat_out,
            unspellable=totals.unspellable,
        )
    return found


def _difference(now: SessionStats, before: SessionStats) -> SessionStats:
    return SessionStats(**{f.name: getattr(now, f.name) - getattr(before, f.name) for f in fields(SessionStats)})
