"""The decode loop every method runs in: commits -> text, stop strings, limits, member sync."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ensemble_core.config import GenerationSettings
from ensemble_core.members.base import Member
from ensemble_core.members.text_sync import MemberSession
from ensemble_core.methods.base import Commit, DecodeState, Method
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


@dataclass
class _Row:
    index: int
    text: TextBuffer
    steps: int = 0


def decode(
    members: Sequence[Member],
    method: Method,
    prompt_ids: dict[int, list[list[int]]],
    settings: GenerationSettings,
    cancel: threading.Event | None = None,
) -> Iterator[StreamChunk]:
    """Generate for every prompt at once; yields text as it becomes final, per prompt index.

    Args:
        prompt_ids: member index -> rendered prompt ids per prompt (participants only).
        cancel: once set, generation ends after the current step, without results.

    Yields:
        `StreamChunk`s; each prompt's last one has `finish_reason` and `result`.
    """
    started = time.perf_counter()
    sessions = {m: members[m].start(prompts) for m, prompts in prompt_ids.items()}
    prompt_lengths = {m: [len(p) for p in prompts] for m, prompts in prompt_ids.items()}
    count = len(next(iter(prompt_ids.values())))
    rows = [_Row(index=i, text=TextBuffer(settings.stop)) for i in range(count)]
    state = DecodeState(members, sessions, settings, [row_generator(settings) for _ in rows])
    run = method.start(members, settings)
    reference = method.reference_member(members)
    while rows:
        if cancel is not None and cancel.is_set():
            return
        state.remaining = [settings.max_new_tokens - row.steps for row in rows]
        commits = run.step(state)
        finished: list[int] = []
        for position, (row, commit) in enumerate(zip(rows, commits, strict=True)):
            reason = _apply(row, commit, settings)
            for member, session in sessions.items():
                session.commit(position, commit.text, own_tokens=commit.proposals.get(member, ()))
            piece = row.text.take_new_text(final=reason is not None)
            if reason is None:
                if piece:
                    yield StreamChunk(text=piece, index=row.index)
                continue
            finished.append(position)
            usage = _usage(members, sessions, prompt_lengths, row.index, position, reason, reference)
            stats = GenerationStats(
                method=method.name,
                steps=row.steps,
                wall_seconds=time.perf_counter() - started,
                members=_member_stats(members, sessions),
                method_stats=run.stats(),
            )
            token_ids = {members[m].name: session.generated_ids(position) for m, session in sessions.items()}
            result = GenerationResult(row.text.text(), reason, usage, stats, bytes(row.text.data), token_ids)
            yield StreamChunk(text=piece, index=row.index, finish_reason=reason, result=result)
        if finished:
            keep = [p for p in range(len(rows)) if p not in finished]
            rows = [rows[p] for p in keep]
            state.generators = [state.generators[p] for p in keep]
            if keep:
                for session in sessions.values():
                    session.select_rows(keep)


def _apply(row: _Row, commit: Commit, settings: GenerationSettings) -> FinishReason | None:
    row.steps += commit.tokens
    if row.text.append(commit.text):
        return "stop"
    if commit.eos:
        return "eos"
    if row.steps >= settings.max_new_tokens:
        return "length"
    return None


def _usage(
    members: Sequence[Member],
    sessions: dict[int, MemberSession],
    prompt_lengths: dict[int, list[int]],
    prompt_index: int,
    position: int,
    reason: FinishReason,
    reference: int,
) -> Usage:
    eos = 1 if reason == "eos" else 0
    per_member = {
        members[m].name: MemberUsage(
            prompt_tokens=prompt_lengths[m][prompt_index],
            completion_tokens=len(session.generated_ids(position)) + eos,
        )
        for m, session in sessions.items()
    }
    headline = per_member[members[reference].name]
    return Usage(headline.prompt_tokens, headline.completion_tokens, members[reference].name, per_member)


def _member_stats(members: Sequence[Member], sessions: dict[int, MemberSession]) -> dict[str, MemberStats]:
    stats = {}
    for m, session in sessions.items():
        forward, sync = session.batch.stats, session.stats()
        stats[members[m].name] = MemberStats(
            forwards=forward.forwards,
            forward_seconds=forward.seconds,
            forwarded_tokens=forward.tokens,
            own_tokens=sync.own_tokens,
            reencoded_tokens=sync.reencoded_tokens,
            rollbacks=sync.rollbacks,
        )
    return stats
