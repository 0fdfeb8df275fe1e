"""Graceful shutdown: on SIGTERM or SIGINT the server drains before it stops.

uvicorn's own handler stops at once: open streams are cut (sse-starlette ends them when the
server says it should exit) and the signal is raised again after, so the process dies of it.
Here the first signal starts a drain instead (`Batcher.drain`): new requests get 503 with
`Retry-After`, `/health` answers 503 "draining" so a load balancer looks elsewhere, and every
queued and running request may finish within the grace period; what is left then ends with a
503 error (a stream gets it as its last event). Only then does uvicorn stop, and the process
exits with status 0. A second signal stops at once.
"""

from __future__ import annotations

import threading
from types import FrameType

import uvicorn

from ensemble_core.batching import Batcher


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signals drain `batcher` for up to `grace` seconds first."""

    def __init__(self, config: uvicorn.Config, batcher: Batcher, grace: float):
        super().__init__(config)
        self.batcher = batcher
        self.grace = grace
        self.drained: bool | None = None  # after a drain: whether nothing was cut short
        self._signalled = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:  # a second signal: no more waiting
            self.should_exit = self.force_exit = True
            return
        self._signalled = True
        threading.Thread(target=self._drain_then_exit, name="ensemble-llm-drain", daemon=True).start()

    def _drain_then_exit(self) -> None:
        self.drained = self.batcher.drain(self.grace)
        self.should_exit = True
