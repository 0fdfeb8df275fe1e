"""Continuous batching: many callers, one ensemble, one batched forward per step.

A `Batcher` owns one scheduler thread. Callers `submit` prepared requests from any thread
(the server's event loop, worker threads); at every step boundary the scheduler admits what
is waiting into a running batch (`DecodeLoop.admit`) and retires what ended, so a request
that arrives while others generate joins them at the next step instead of waiting for the
whole batch. Requests that cannot share a batch (another temperature, top_p or stop list:
methods read those from the batch) run in batches of their own, stepped in turn.

Each ticket's chunks go to its `deliver` callback, in order, from the scheduler thread; the
last call is a chunk with a `result`, or an exception (`QueueFull` never reaches it: that is
raised by `submit`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ensemble_core.decode import DecodeLoop, batch_key
from ensemble_core.ensemble import Ensemble, PreparedRequest
from ensemble_core.errors import ConfigError, EnsembleError, MemberFailedError
from ensemble_core.member_health import MemberHealth
from ensemble_core.members.contract import RequestId
from ensemble_core.results import StreamChunk

Deliver = Callable[["StreamChunk | BaseException"], None]
"""Called from the scheduler thread with each chunk of a ticket, or with the error that ended it."""


class QueueFull(EnsembleError):
    """More requests are waiting than the batcher's queue holds; try again later (HTTP 429)."""


class RequestTimeout(EnsembleError):
    """A request ran past its deadline and was stopped (HTTP 504 for a server)."""


class ShuttingDown(EnsembleError):
    """The batcher is draining for a shutdown: it takes no new requests (HTTP 503), and ends
    what is still unfinished when the grace period is over."""


@dataclass(eq=False)
class Ticket:
    """One submitted request: its place in the queue, then in a running batch."""

    prepared: PreparedRequest
    deliver: Deliver
    deadline: float | None  # time.monotonic() value
    number: int
    cancelled: bool = False
    request: RequestId | None = None
    loop: DecodeLoop | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop this request at the next step boundary (nothing more is delivered)."""
        self.cancelled = True


class Batcher:
    """Runs every submitted request of one ensemble in continuously batched steps.

    Args:
        ensemble: the ensemble (its steps are taken while holding it, so direct calls to it
            still work, between steps).
        max_batch: the most requests generating at once (all batches together).
        max_queue: the most requests waiting to be admitted; `submit` raises `QueueFull` beyond.
    """

    def __init__(self, ensemble: Ensemble, max_batch: int = 8, max_queue: int = 64):
        if max_batch < 1 or max_queue < 1:
            raise ConfigError(f"`max_batch` and `max_queue` must be >= 1, but are {max_batch} and {max_queue}.")
        self.ensemble = ensemble
        self.max_batch = max_batch
        self.max_queue = max_queue
        self._waiting: deque[Ticket] = deque()
        self._running: list[Ticket] = []
        self._loops: list[DecodeLoop] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._draining = False
        self._closing_error: BaseException = EnsembleError("The batcher was closed before the request finished.")
        self._numbers = itertools.count()
        self.steps = 0
        """Steps taken so far (all batches); a test's and a benchmark's evidence of batching."""
        self.members = MemberHealth(ensemble.members)
        """Each member's state: a failed forward, a restart (`/health` shows it)."""
        self._thread = threading.Thread(target=self._serve, name="ensemble-llm-batcher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers' side

    def submit(self, prepared: PreparedRequest, deliver: Deliver, timeout: float | None = None) -> Ticket:
        """Queue one request; raises `QueueFull` when `max_queue` requests already wait.

        Args:
            timeout: seconds from now after which the request is stopped with `RequestTimeout`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wake:
            if self._stopping:
                raise EnsembleError("This batcher was closed (or its ensemble was); make a new one.")
            if self._draining:
                raise ShuttingDown("The server is shutting down and takes no new requests; retry shortly.")
            waiting = sum(not t.cancelled for t in self._waiting)
            if waiting >= self.max_queue:
                raise QueueFull(f"{waiting} requests are already waiting (max_queue={self.max_queue}); retry later.")
            ticket = Ticket(prepared, deliver, deadline, next(self._numbers))
            self._waiting.append(ticket)
            self._wake.notify()
        return ticket

    @property
    def load(self) -> tuple[int, int]:
        """(requests generating, requests waiting)."""
        with self._wake:
            return len(self._running), len(self._waiting)

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self, grace: float) -> bool:
        """Take no new requests (`submit` raises `ShuttingDown`) and wait up to `grace` seconds
        for every queued and running one to finish; what is left then ends with `ShuttingDown`
        (its caller gets that error: a stream its last event). True if nothing was cut short."""
        deadline = time.monotonic() + grace
        with self._wake:
            self._draining = True
            while (self._waiting or self._running) and not self._stopping and time.monotonic() < deadline:
                self._wake.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            finished = not self._waiting and not self._running
            self._closing_error = ShuttingDown(f"The server shut down before the request finished (grace {grace:g} s).")
        self.close()
        return finished

    def close(self) -> None:
        """Stop the scheduler: unfinished requests end with an error; the ensemble stays open."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    # ------------------------------------------------------------------ the scheduler thread

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._running:
                    self._wake.wait()
                if self._stopping:
                    break
                admitting = self._take_admissible()
            try:
                self._admit(admitting)
                self._retire_expired()
                self._step_all()
            except BaseException as error:  # the ensemble closed under us, or a bug: no one may hang
                self._end_all(error)
                return
        self._end_all(self._closing_error)

    def _take_admissible(self) -> list[Ticket]:
        """Called holding `_wake`: drop dead tickets (cancelled, or past their deadline, on
        every pass, so they never fill the queue), then take what fits into the batch."""
        now = time.monotonic()
        live: deque[Ticket] = deque()
        for ticket in self._waiting:
            if ticket.cancelled:
                continue
            if ticket.deadline is not None and now >= ticket.deadline:
                _hand(ticket, RequestTimeout("The request waited past its timeout and was not started."))
                continue
            live.append(ticket)
        self._waiting = live
        room = self.max_batch - len(self._running)
        return [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]

    def _admit(self, tickets: list[Ticket]) -> None:
        groups: dict[tuple, list[Ticket]] = {}
        for ticket in tickets:
            groups.setdefault(batch_key(ticket.prepared.settings), []).append(ticket)
        for key, group in groups.items():
            loop = next((lp for lp in self._loops if batch_key(lp.settings) == key), None)
            try:
                with self.ensemble.hold():
                    if loop is None:
                        loop = self.ensemble.open_loop(group[0].prepared.settings)
                        self._loops.append(loop)
                    handles = self.ensemble.admit(loop, [t.prepared for t in group])
            except Exception as error:  # handed to each request's caller
                for ticket in group:
                    _hand(ticket, error)
                continue
            for ticket, handle in zip(group, handles, strict=True):
                ticket.request, ticket.loop = handle, loop
                self._running.append(ticket)

    def _retire_expired(self) -> None:
        now = time.monotonic()
        for ticket in list(self._running):
            expired = ticket.deadline is not None and now >= ticket.deadline
            if not (ticket.cancelled or expired):
                continue
            if expired and not ticket.cancelled:  # told first: freeing its rows may fail (a closed ensemble)
                _hand(ticket, RequestTimeout("The request ran past its timeout and was stopped."))
            self._leave(ticket)

    def _step_all(self) -> None:
        for loop in list(self._loops):
            if not loop.requests:
                self._loops.remove(loop)  # its sessions go with it; a new batch starts fresh
                continue
            owners = {t.request: t for t in self._running if t.loop is loop}
            try:
                with self.ensemble.hold():
                    out = loop.step()
                self.steps += 1
                self.members.recovered()
            except Exception as error:  # handed to each request's caller; the other batches go on
                self._loops.remove(loop)
                self._close_quietly(loop)  # its caches go now (after running out of memory, they must)
                for ticket in owners.values():
                    self._running.remove(ticket)
                    _hand(ticket, error)
                if isinstance(error, MemberFailedError):
                    self.members.failed(error)
                continue
            for request, chunk in out:
                ticket = owners[request]
                if chunk.result is not None:
                    self._running.remove(ticket)
                    if self._draining:
                        with self._wake:
                            self._wake.notify_all()  # a drain waits for this
                if not ticket.cancelled:
                    _hand(ticket, chunk)

    def _leave(self, ticket: Ticket) -> None:
        self._running.remove(ticket)
        if ticket.loop is not None and ticket.request is not None:
            with self.ensemble.hold():
                ticket.loop.cancel([ticket.request])

    def _close_quietly(self, loop: DecodeLoop) -> None:
        # a failed loop may fail to close too; its error is already handed out
        with contextlib.suppress(Exception), self.ensemble.hold():
            loop.close()

    def _end_all(self, error: BaseException) -> None:
        with self._wake:
            self._stopping = True  # nothing submitted from now on would ever be served
            left = list(self._waiting) + list(self._running)
            self._waiting.clear()
        self._running = []
        for loop in self._loops:
            try:
                with self.ensemble.hold():
                    loop.close()
            except EnsembleError:
                pass  # the ensemble was closed first: its members are gone anyway
        self._loops = []
        for ticket in left:
            if not ticket.cancelled:
                _hand(ticket, error)


def _hand(ticket: Ticket, item: StreamChunk | BaseException) -> None:
    """Deliver without letting one caller's failing callback stop everyone's generation."""
    try:
        ticket.deliver(item)
    except Exception:  # a caller's callback; the caller learns nothing more either way
        ticket.cancelled = True
