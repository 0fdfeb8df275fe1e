"""Asyncio access to an ensemble: generation in a worker thread, the event loop never blocked.

Generation is CPU/GPU work in torch, so it runs in a thread of its own per call (not a
shared pool, which a burst of waiting callers could fill); chunks cross to the event loop
through a queue. Cancelling the consuming task, or closing the async iterator early, sets
the stream's cancel event: the worker stops after the current step and releases the
ensemble, so the next call runs normally.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ensemble_core.results import GenerationResult, StreamChunk

if TYPE_CHECKING:
    from ensemble_core.ensemble import Ensemble


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


async def astream(ensemble: Ensemble, prompt: Any, **arguments: Any) -> AsyncIterator[StreamChunk]:
    """`ensemble.stream(prompt, **arguments)`, consumed without blocking the event loop.

    Input errors are raised here, before any thread starts (the prompt is rendered in the
    caller, which takes milliseconds). A `cancel` event may be passed in (e.g. for a timeout);
    otherwise one is made, and set when the consumer stops early.
    """
    cancel = arguments.pop("cancel", None) or threading.Event()
    chunks = ensemble.stream(prompt, cancel=cancel, **arguments)
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


async def agenerate(ensemble: Ensemble, prompt: Any, **arguments: Any) -> GenerationResult:
    """The result of `astream` (cancelling the awaiting task stops the generation)."""
    stream = astream(ensemble, prompt, **arguments)
    try:
        async for chunk in stream:
            if chunk.result is not None:
                return chunk.result
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    raise RuntimeError("the generation ended without a result")  # only if cancelled from elsewhere
