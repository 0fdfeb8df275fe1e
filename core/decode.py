"""The decode loop every method runs in: commits -> text, stop strings, limits, member sync.

Every prompt of a call becomes a request with a stable `RequestId`. Members' sessions and the
method's run key all per-request state by it, so when one request ends (and its rows are freed)
no other request inherits anything of it; both learn of ended requests through one hook,
`_retire`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.members.base import Member
from ensemble_core.members.contract import Boundary, MemberSession, RenderedPrompt, RequestId
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
    index: int  # the prompt's position in the call
    text: TextBuffer
    steps: int = 0


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
    """Generate for every prompt at once; yields text as it becomes final, per prompt index.

    Args:
        prompts: member index -> its rendered prompt per prompt (participants only).
        boundary: how members continue text they did not write.
        device: where the method combines distributions.
        cancel: once set, generation ends after the current step, without results.
        weights: per prompt, member weights found before generating (else the binding's).
        lanes: where each member's work runs (`members.lanes`; None: all in this thread).

    Yields:
        `StreamChunk`s; each prompt's last one has `finish_reason` and `result`.
    """
    started = time.perf_counter()
    count = len(next(iter(prompts.values())))
    requests = [RequestId(next(_REQUEST_IDS)) for _ in range(count)]
    lanes = lanes or Lanes()
    sessions: dict[int, MemberSession] = {
        m: lanes.session(m, members[m].start(dict(zip(requests, rendered, strict=True)), boundary))
        for m, rendered in prompts.items()
    }
    active = [_Active(request, index, TextBuffer(settings.stop)) for index, request in enumerate(requests)]
    state = DecodeState(
        members=binding.members,
        sessions=sessions,
        settings=settings,
        requests=list(requests),
        generators={request: row_generator(settings) for request in requests},
        tails={a.request: a.text.tail for a in active},
        device=device,
        weights=dict(zip(requests, weights, strict=True)) if weights is not None else {},
        lanes=lanes,
    )
    run = binding.start(settings, device)
    try:
        while active:
            if cancel is not None and cancel.is_set():
                return
            state.requests = [a.request for a in active]
            state.remaining = {a.request: settings.max_new_tokens - a.steps for a in active}
            commits = run.step(state)
            finished: list[_Active] = []
            for item in active:
                commit = commits[item.request]
                reason = _apply(item, commit, settings)
                for session in sessions.values():
                    session.commit(item.request, commit.text)
                piece = item.text.take_new_text(final=reason is not None)
                if reason is None:
                    if piece:
                        yield StreamChunk(text=piece, index=item.index)
                    continue
                finished.append(item)
                result = _result(members, binding, sessions, run, item, reason, started)
                yield StreamChunk(text=piece, index=item.index, finish_reason=reason, result=result)
            if finished:
                _retire([f.request for f in finished], run, sessions, state)
                active = [a for a in active if a not in finished]
    finally:
        if active:  # cancelled, closed or failed: free what the unfinished requests hold
            _retire([a.request for a in active], run, sessions, state)


def _retire(requests: list[RequestId], run: MethodRun, sessions: dict[int, MemberSession], state: DecodeState) -> None:
    """The one hook through which the method and every member learn that requests ended."""
    run.drop(requests)
    for session in sessions.values():
        session.drop(requests)
    state.forget(requests)


def _apply(item: _Active, commit: Commit, settings: GenerationSettings) -> FinishReason | None:
    item.steps += commit.tokens
    if item.text.append(commit.text):
        return "stop"
    if commit.eos:
        return "eos"
    if item.steps >= settings.max_new_tokens:
        return "length"
    return None


def _result(
    members: Sequence[Member],
    binding: Binding,
    sessions: dict[int, MemberSession],
    run: MethodRun,
    item: _Active,
    reason: FinishReason,
    started: float,
) -> GenerationResult:
    usage = _usage(members, binding, sessions, item.request, reason)
    stats = GenerationStats(
        method=binding.method.name,
        steps=item.steps,
        wall_seconds=time.perf_counter() - started,
        members=_member_stats(members, sessions),
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


def _member_stats(members: Sequence[Member], sessions: dict[int, MemberSession]) -> dict[str, MemberStats]:
    found = {}
    for m, session in sessions.items():
        totals = session.stats()
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
