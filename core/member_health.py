"""Each member's state as a server reports it, and the restart of a member whose host died.

A member's forward can fail mid-batch (out of memory, a driver error) or its host can die (a
Ray actor). The batcher fails only that batch's requests (`MemberFailedError`, HTTP 503 naming
the member) and tells this record, which `/health` shows. A member that can say it is dead
(`RayMember.alive()`) is restarted here at once, automatically: a server should heal without an
operator, and every request would fail until then anyway. The record clears at the next step
that succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ensemble_core.errors import EnsembleError, MemberFailedError
from ensemble_core.members.base import Member


class MemberHealth:
    """The members' last failures and restarts, safe to read from any thread."""

    def __init__(self, members: Sequence[Member]):
        self._members = list(members)
        self._faults: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.restarts = 0

    def failed(self, error: MemberFailedError) -> None:
        """Record a member's failure; restart it when its host is gone (called by the scheduler)."""
        fault: dict[str, Any] = {"state": "failed", "error": str(error)}
        member = next((m for m in self._members if m.name == error.member), None)
        if member is not None and _host_gone(member):
            try:
                member.restart()  # type: ignore[attr-defined]  # the members that can be gone can restart
                self.restarts += 1
                fault["restarted"] = True
            except EnsembleError as restart_error:
                fault = {"state": "dead", "error": f"{error} Restarting it failed: {restart_error}"}
        with self._lock:
            self._faults[error.member] = fault

    def recovered(self) -> None:
        """A step succeeded: the members that took part work again (called by the scheduler)."""
        if self._faults:
            with self._lock:
                self._faults = {name: f for name, f in self._faults.items() if f["state"] == "dead"}

    def report(self) -> list[dict[str, Any]]:
        """Per member: name and state ("ok", "failed": its last step failed, "dead": it cannot be
        restarted), with the error when not ok."""
        with self._lock:
            faults = dict(self._faults)
        return [{"name": m.name, **faults.get(m.name, {"state": "ok"})} for m in self._members]

    @property
    def any_dead(self) -> bool:
        with self._lock:
            return any(f["state"] == "dead" for f in self._faults.values())


def _host_gone(member: Member) -> bool:
    alive = getattr(member, "alive", None)
    return callable(alive) and not alive()
