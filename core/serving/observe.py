"""What an operator watches: a request id on every reply, and Prometheus metrics at /metrics.

One pure ASGI middleware does both. It wraps only `send` (a Starlette `BaseHTTPMiddleware`
wraps `receive` too, and a streaming client's disconnect would no longer reach the endpoint):
it gives each HTTP request an id (the client's `X-Request-Id` when it sends a sane one, else a
new one), returns it as `X-Request-Id`, and when the response's last body part is sent it
counts the request by route and status and observes its duration (a stream's: until its last
event). Gauges of the batcher's queue are read when /metrics is scraped.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


class ServerMetrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, load: Callable[[], tuple[int, int]], steps: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ensemble_llm_requests",
            "HTTP requests answered, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "ensemble_llm_request_seconds",
            "Time from a request's arrival to its reply's last byte.",
            ["route"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.tokens = Counter(
            "ensemble_llm_completion_tokens", "Tokens generated (as the usage reports them).", registry=self.registry
        )
        running = Gauge("ensemble_llm_running_requests", "Requests generating now.", registry=self.registry)
        waiting = Gauge("ensemble_llm_waiting_requests", "Requests queued, not yet generating.", registry=self.registry)
        running.set_function(lambda: load()[0])
        waiting.set_function(lambda: load()[1])
        Gauge("ensemble_llm_decode_steps", "Batched decode steps taken.", registry=self.registry).set_function(
            lambda: steps()
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def request_id_of(scope: Scope) -> str:
    """The id a request goes by (set by `ObservingMiddleware`)."""
    return scope.get("state", {}).get("request_id", "")


class ObservingMiddleware:
    """Request ids and metrics for every HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SANE_ID.fullmatch(given) else f"req_{uuid.uuid4().hex[:24]}"
        scope.setdefault("state", {})["request_id"] = request_id
        route = scope.get("path", "") if scope.get("path", "") in _ROUTES else "other"
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.metrics.requests.labels(route, str(status)).inc()
                self.metrics.seconds.labels(route).observe(time.perf_counter() - started)

        await self.app(scope, receive, sending)
