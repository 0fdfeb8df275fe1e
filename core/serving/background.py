"""Serve an app from a background thread of this process (tests, benchmarks, notebooks)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from ensemble_core.errors import EnsembleError


@contextlib.contextmanager
def serving_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """Run `app` with uvicorn on a free port (or `port`) until the block ends; yields the
    base URL of its API (`http://host:port/v1`), once the server accepts connections."""
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    bound = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="ensemble-llm-server")
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout)
            listener.close()
            raise EnsembleError(f"The server did not start on {host}:{bound} within {timeout:.0f} s.")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{bound}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout)
        listener.close()
