"""Asyncio access to a stream of chunks: the work in a worker thread, the event loop never blocked.

Generation is CPU/GPU work in torch, so it runs in a thread of its own per call (not a shared
pool, which a burst of waiting callers could fill); chunks cross to the event loop through a
queue. Cancelling the consuming task, or closing the async iterator early, sets the stream's
cancel event: the worker stops after the current step and releases the ensemble, so the next
call runs normally.

This module knows nothing of `Ensemble`: the ensemble validates and renders the request first
(so bad input raises at the call, exactly as `stream` does), then hands the ready iterator here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from ensemble_core.results import GenerationResult, StreamChunk


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


async def iterate_in_thread(chunks: Iterator[StreamChunk], cancel: threading.Event) -> AsyncIterator[StreamChunk]:
    """The chunks of `chunks`, produced in a worker thread; `cancel` is set when consumption stops."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    worker = threading.Thread(target=_pump, args=(chunks, cancel, loop, queue), name="ensemble-generate", daemon=True)
    worker.start()
    try:
        while (item := await queue.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        cancel.set()


def _pump(chunks: Iterator[StreamChunk], cancel: threading.Event, loop: asyncio.AbstractEventLoop, queue: Any) -> None:
    """Worker thread: run the stream, hand each chunk to the loop, stop when cancelled."""

    def hand_over(item: Any) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(queue.put_nowait, item)

    try:
        for chunk in chunks:
            if cancel.is_set():
                break
            hand_over(chunk)
    except BaseException as error:  # handed to the awaiting task, which re-raises it
        hand_over(_Failed(error))
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # ends the generation and releases the ensemble's lock in this thread
        hand_over(_DONE)


async def last_result(stream: AsyncIterator[StreamChunk]) -> GenerationResult:
    """The result the stream ends with (cancelling the awaiting task stops the generation)."""
    try:
        async for chunk in stream:
            if chunk.result is not None:
                return chunk.result
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    raise asyncio.CancelledError("the generation was cancelled before it produced a result")
