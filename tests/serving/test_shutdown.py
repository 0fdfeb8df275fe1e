"""`ensemble-llm serve` stopped with SIGTERM while streams are open: it drains, then exits 0.

A real server process over a real packaged model (the signal, uvicorn and sse-starlette are
what is under test, so nothing runs in-process): four streamed requests are open when SIGTERM
arrives; each gets its final event, a new request gets 503 with `Retry-After` meanwhile, and
the process exits with status 0. With a grace period too short for the replies, the streams
end with an error event, not a cut connection.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def start_server() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(grace: float) -> tuple[subprocess.Popen, str]:
        port = free_port()
        command = [sys.executable, "-m", "ensemble_core.cli", "serve", "-m", MODEL, "--port", str(port)]
        process = subprocess.Popen(
            [*command, "--grace", str(grace), "--model-id", "x"],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(process)
        root = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                    return process, root
            except httpx.TransportError:
                time.sleep(0.3)
            assert process.poll() is None, process.stdout.read()  # type: ignore[union-attr]
        raise AssertionError("the server did not come up")

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def stream(root: str, tokens: int, events: list, first: threading.Event) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "Tell me a long story."}], "stream": True}
    with httpx.stream("POST", f"{root}/v1/chat/completions", json={**body, "max_tokens": tokens}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                first.set()


def open_streams(root: str, tokens: int) -> tuple[list[threading.Thread], list[list[str]]]:
    found: list[list[str]] = [[] for _ in range(4)]
    started = [threading.Event() for _ in found]
    threads = [threading.Thread(target=stream, args=(root, tokens, f, s)) for f, s in zip(found, started, strict=True)]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(60), "a stream never started"
    return threads, found


@pytest.mark.packaged
def test_sigterm_lets_open_streams_finish_and_refuses_new_requests(start_server) -> None:
    process, root = start_server(grace=60)
    threads, found = open_streams(root, tokens=48)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.post(
        f"{root}/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "shutting_down"
    assert httpx.get(f"{root}/health").json()["status"] == "draining"
    for thread in threads:
        thread.join(120)
    for events in found:
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] in ("stop", "length") or last.get("usage")
    assert process.wait(60) == 0


@pytest.mark.packaged
def test_past_the_grace_period_open_streams_end_with_an_error_event(start_server) -> None:
    process, root = start_server(grace=0.5)
    threads, found = open_streams(root, tokens=2000)
    process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(120)
    for events in found:
        errors = [json.loads(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
        assert errors and errors[-1]["error"]["code"] == "shutting_down"
    assert process.wait(60) == 0
