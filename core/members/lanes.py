"""Lanes: where each member's work runs, so members on different devices step concurrently.

A method asks several members for something in one step (GaC: every member's next
distribution; SAFE: the drafter's draft while the verifiers read the committed text). Run one
after another, the step costs the SUM of the members' times; run concurrently, it costs the
slowest member's. Torch releases the GIL inside its kernels, so Python threads are enough.

* Members on one GPU share that GPU's lane and step back to back (their kernels would queue on
  the device anyway); members on different GPUs step concurrently.
* A CPU member with its own thread budget (`HFMember.from_pretrained(..., num_threads=1)`) has
  a lane of its own, whose thread runs torch with that many intra-op threads; two such members
  step concurrently on their own cores.
* Any other CPU member runs in the calling thread, as before (it uses the process's threads).

A lane is one long-lived thread: torch's thread pools and the allocator's arena are set up once
per thread, not per call. Every call on a laned member's session runs in its lane, wherever it
is made from; work for members without a lane runs inline in the calling thread, at no cost.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import MemberSession

T = TypeVar("T")

_STOP = object()


def check_num_threads(num_threads: int | None) -> int | None:
    """A thread budget: None (the process's threads) or a positive integer."""
    if num_threads is None:
        return None
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ConfigError(f"`num_threads` has to be a positive integer or None, but is {num_threads!r}.")
    return num_threads


def lane_key(device: torch.device, num_threads: int | None, name: str, remote: bool = False) -> str | None:
    """Which lane a member's work runs in: its GPU's, its own (a CPU thread budget, or a member
    hosted elsewhere, whose calls only wait on the wire), or None (inline)."""
    if remote:
        return f"remote:{name}"
    if device.type == "cpu":
        return f"cpu:{name}" if num_threads is not None else None
    return str(device)


class Lane:
    """One long-lived worker thread that runs submitted calls in order."""

    def __init__(self, key: str, num_threads: int | None = None):
        self.key = key
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(num_threads, ready), name=f"ensemble-lane-{key}", daemon=True
        )
        # torch.set_num_threads sets this thread's OpenMP budget AND the process default that new
        # threads start from: keep the caller's default as it was.
        before = torch.get_num_threads()
        self._thread.start()
        ready.wait()
        if num_threads is not None:
            torch.set_num_threads(before)

    def _serve(self, num_threads: int | None, ready: threading.Event) -> None:
        if num_threads is not None:
            # A thread's first torch call resets its budget from the process default: make that
            # call first, so the budget set next is the one that stays.
            torch.get_num_threads()
            torch.set_num_threads(num_threads)
        ready.set()
        while (call := self._calls.get()) is not _STOP:
            future, work = call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as error:  # handed to the caller, which re-raises it
                    future.set_exception(error)

    def call(self, work: Callable[[], T]) -> T:
        """`work()` in this lane, waiting for its result (directly when already in this lane)."""
        if threading.current_thread() is self._thread:
            return work()
        return self.submit(work).result()

    def submit(self, work: Callable[[], T]) -> Future[T]:
        if not self._thread.is_alive():
            raise RuntimeError(f"lane {self.key!r} was closed")
        future: Future[T] = Future()
        self._calls.put((future, work))
        return future

    def close(self) -> None:
        if self._thread.is_alive():
            self._calls.put(_STOP)
            if threading.current_thread() is not self._thread:
                self._thread.join()


class Lanes:
    """The lanes of one ensemble's members (member index -> lane, None: the calling thread)."""

    def __init__(self, keys: Mapping[int, str | None] | None = None, budgets: Mapping[int, int | None] | None = None):
        """`keys`: member index -> its lane key (`lane_key`); `budgets`: the first member of each
        lane sets its thread budget. No keys: every member runs in the calling thread."""
        keys, budgets = keys or {}, budgets or {}
        self._lanes: dict[str, Lane] = {}
        self._of: dict[int, Lane | None] = {}
        for member, key in keys.items():
            if key is not None and key not in self._lanes:
                self._lanes[key] = Lane(key, budgets.get(member))
            self._of[member] = self._lanes[key] if key is not None else None

    def session(self, member: int, session: MemberSession) -> MemberSession:
        """The member's session as methods see it: every call runs in the member's lane (so a
        CPU member always computes with its own thread budget), wherever it is made from."""
        lane = self._of.get(member)
        return session if lane is None else LanedSession(session, lane)

    def each(self, members: Iterable[int], work: Callable[[int], T]) -> dict[int, T]:
        """`work(m)` for every member, as `run` runs them (results by member, in the given order)."""
        return self.run({m: functools.partial(work, m) for m in members})

    def run(self, work: Mapping[int, Callable[[], T]]) -> dict[int, T]:
        """Every member's call, members of different lanes concurrently; results by member.

        Calls of members that share a lane run one after another, in the order given. A failure
        is raised once every call has ended (no call still runs when this returns).
        """
        groups: dict[Lane | None, list[int]] = {}
        for member in work:
            groups.setdefault(self._of.get(member), []).append(member)
        if list(groups) == [None]:
            return _in_order(work, groups[None])
        futures = [
            lane.submit(lambda ms=members: _in_order(work, ms)) for lane, members in groups.items() if lane is not None
        ]
        found: dict[int, T] = {}
        inline_error: BaseException | None = None
        if None in groups:
            try:
                found.update(_in_order(work, groups[None]))
            except BaseException as error:  # wait for the lanes before raising
                inline_error = error
        errors = []
        for future in futures:
            try:
                found.update(future.result())
            except BaseException as error:
                errors.append(error)
        if inline_error is not None:
            raise inline_error
        if errors:
            raise errors[0]
        return {m: found[m] for m in work}

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()


class LanedSession:
    """A `MemberSession` whose every call runs in one lane (see `Lanes.session`)."""

    def __init__(self, session: MemberSession, lane: Lane):
        self._session = session
        self._lane = lane

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._session, name)
        if not callable(found):
            return found
        return functools.wraps(found)(lambda *args, **kwargs: self._lane.call(lambda: found(*args, **kwargs)))


def _in_order(work: Mapping[int, Callable[[], T]], members: list[int]) -> dict[int, T]:
    return {m: work[m]() for m in members}
