"""The ASGI app of `ensemble-llm serve`: OpenAI's chat and completions API over one ensemble.

Every generation goes through one `Batcher`, so concurrent requests share batched forwards
(continuous batching). Input is checked, and prompts rendered and measured against the
context window, before a request is queued: a bad request costs no model time. The event
loop never runs model work; it waits on the batcher's deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ensemble_core.batching import Batcher, QueueFull, RequestTimeout, ShuttingDown, Ticket
from ensemble_core.chat.reply import Reply, ReplyAssembler
from ensemble_core.chat.request import ChatRequest, build_request
from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import ConfigError, EnsembleError, MemberFailedError, TemplateError
from ensemble_core.results import GenerationResult, StreamChunk
from ensemble_core.serving import openai_format as wire
from ensemble_core.serving.observe import ObservingMiddleware, ServerMetrics
from ensemble_core.serving.openai_format import ApiError, ParsedCall

_DISCONNECT_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class ServeSettings:
    """How the server answers.

    Attributes:
        model_id: the one model id it serves (`GET /v1/models`); default: the ensemble's name.
        api_key: when set, every `/v1` request needs `Authorization: Bearer <key>`.
        max_batch: requests generating at once (one batched forward per step).
        max_queue: requests waiting beyond those; more get 429.
        request_timeout: seconds a request may take in all (queue included) before it is stopped (504).
        default_tokens: `max_tokens` when a request gives none.
        max_tokens: the largest `max_tokens` a request may ask for.
        max_body_bytes: the largest request body (413 beyond).
        cors_origins: origins allowed by CORS (none: CORS stays off).
    """

    model_id: str | None = None
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int = 64
    request_timeout: float = 600.0
    default_tokens: int = 256
    max_tokens: int = 4096
    max_body_bytes: int = 1 << 20
    cors_origins: tuple[str, ...] = ()


def create_app(ensemble: Ensemble, settings: ServeSettings | None = None) -> FastAPI:
    """The app for one ensemble; its batcher starts now and ends with the app's shutdown
    (`app.state.batcher`). The ensemble stays open: closing it is the caller's job."""
    settings = settings or ServeSettings()
    served = settings.model_id or ensemble.model_name
    batcher = Batcher(ensemble, max_batch=settings.max_batch, max_queue=settings.max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(batcher.close)

    app = FastAPI(title="ensemble-llm", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.batcher = batcher
    metrics = ServerMetrics(lambda: batcher.load, lambda: batcher.steps)
    app.state.metrics = metrics
    app.add_middleware(ObservingMiddleware, metrics=metrics)
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["*"], allow_headers=["*"]
        )
    created = int(time.time())
    limits = {"served": served, "default_tokens": settings.default_tokens, "max_tokens": settings.max_tokens}

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body, status_code=error.status, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:  # 404, 405, ...
        body = ApiError(error.status_code, str(error.detail)).body
        return JSONResponse(body, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, error: Exception) -> JSONResponse:
        found = _api_error_of(error)
        return JSONResponse(found.body, status_code=found.status, headers=found.headers)

    def guard(request: Request) -> None:
        """Every /v1 call: the API key, then the declared body size. (An endpoint check, not an
        HTTP middleware: Starlette's middleware wraps `receive`, and a client's disconnect would
        no longer reach `Request.is_disconnected`.)"""
        _check_key(request, settings.api_key)
        _check_size(request, settings.max_body_bytes)

    @app.get("/health")
    async def health() -> Any:
        running, waiting = batcher.load
        members = batcher.members.report()
        # draining or a member that cannot be restarted: a load balancer stops sending here (503);
        # a member whose last step failed ("degraded") may well serve the next one
        unable = batcher.draining or batcher.members.any_dead
        status = "draining" if batcher.draining else "dead member" if unable else _state_of(members)
        found = {"status": status, "model": served, "running": running, "waiting": waiting, "members": members}
        return JSONResponse(found, status_code=503 if unable else 200)

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        # behind the API key like every route but /health (a scraper sends it: `authorization`)
        _check_key(request, settings.api_key)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        guard(request)
        card = {"id": served, "object": "model", "created": created, "owned_by": "ensemble-llm"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        guard(request)
        body = await _json_body(request, settings.max_body_bytes)
        call = wire.read_chat_body(body, **limits)
        chat = await asyncio.to_thread(_chat_request, ensemble, call, served)  # may score tools (pick_tool)
        return await answer(call, chat, request, as_chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        guard(request)
        body = await _json_body(request, settings.max_body_bytes)
        call = wire.read_completion_body(body, **limits)
        chat = _checked(lambda: ChatRequest(call.messages, _settings_only(call.options)))
        return await answer(call, chat, request, as_chat=False)

    async def answer(call: ParsedCall, chat: ChatRequest, request: Request, *, as_chat: bool) -> Any:
        chunks = await _submit(ensemble, batcher, chat, settings.request_timeout)
        chunks.on_result = lambda result: metrics.tokens.inc(result.usage.completion_tokens)
        completion_id = wire.new_id("chatcmpl" if as_chat else "cmpl")
        if call.stream:
            events = _events(chunks, chat, completion_id, served, call.include_usage, as_chat=as_chat)
            return EventSourceResponse(events)
        reply = await _whole_reply(chunks, chat, request)
        whole = wire.chat_completion if as_chat else wire.text_completion
        return whole(reply, completion_id, served)

    return app


# ---------------------------------------------------------------------- checks


def _check_key(request: Request, api_key: str | None) -> None:
    if not api_key:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), api_key.encode()):
        raise ApiError(401, "Missing or wrong API key: send `Authorization: Bearer <key>`.", code="invalid_api_key")


def _check_size(request: Request, limit: int) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"The request body is {length} bytes; this server takes at most {limit}.")


async def _json_body(request: Request, limit: int) -> Any:
    raw = await request.body()
    if len(raw) > limit:
        raise ApiError(413, f"The request body is {len(raw)} bytes; this server takes at most {limit}.")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None
    except RecursionError:
        body = _TOO_DEEP  # deeper than Python's parser goes: certainly deeper than the limit
    if body is _TOO_DEEP or _nesting(body) > MAX_JSON_DEPTH:
        raise ApiError(400, f"The request body nests JSON deeper than {MAX_JSON_DEPTH} levels; flatten it.")
    return body


_TOO_DEEP = object()
MAX_JSON_DEPTH = 64
"""The deepest JSON a request may nest (an OpenAI body needs under 10; tool schemas a few more):
deeper bodies are refused before anything walks them recursively."""


def _nesting(value: Any) -> int:
    """How deep containers nest in a parsed JSON value (walked without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _checked(work: Callable[[], Any]) -> Any:
    """Run input checks, turning the core's `ConfigError` and a chat template's refusal of the
    conversation (`TemplateError`: the request cannot be rendered, so retrying cannot help)
    into a 400 that says why."""
    try:
        return work()
    except (ConfigError, TemplateError) as error:
        code = "context_length_exceeded" if "context window" in str(error) else None
        raise ApiError(400, str(error), code=code) from None


def _settings_only(options: dict[str, Any]) -> dict[str, Any]:
    settings = dict(options)
    settings["stop"] = [settings["stop"]] if isinstance(settings.get("stop"), str) else settings.get("stop") or []
    return settings


def _chat_request(ensemble: Ensemble, call: ParsedCall, served: str) -> ChatRequest:
    return _checked(
        lambda: build_request(
            call.messages,
            {},
            call.options,
            pick_tool=ensemble.pick_tool,
            served=served,
            caller="the server",
            constrains=ensemble.constrains,
        )
    )


# ---------------------------------------------------------------------- generation


async def _submit(ensemble: Ensemble, batcher: Batcher, chat: ChatRequest, timeout: float) -> _Deliveries:
    """Check and render the request (400 on bad input), then queue it (429 when full, 503 while
    the server drains for a shutdown)."""
    if batcher.draining:
        raise _api_error_of(ShuttingDown("The server is shutting down and takes no new requests; retry shortly."))
    prepared = await asyncio.to_thread(_checked, lambda: ensemble.prepare(chat.prompt, **chat.core_arguments))
    deliveries = _Deliveries(asyncio.get_running_loop())
    try:
        deliveries.ticket = batcher.submit(prepared, deliveries.put, timeout=timeout)
    except QueueFull as error:
        raise ApiError(429, str(error), kind="rate_limit_error", code="queue_full") from None
    except ShuttingDown as error:
        raise _api_error_of(error) from None
    return deliveries


class _Deliveries:
    """A ticket's chunks, handed from the batcher's thread to the event loop, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue[StreamChunk | BaseException] = asyncio.Queue()
        self.ticket: Ticket | None = None
        self.on_result: Callable[[GenerationResult], None] | None = None

    def put(self, item: StreamChunk | BaseException) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def __aiter__(self) -> AsyncIterator[StreamChunk]:
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise _api_error_of(item)
                if item.result is not None and self.on_result is not None:
                    self.on_result(item.result)
                yield item
                if item.result is not None:
                    return
        finally:  # the client went away, or the reply ended: either way nothing more is wanted
            if self.ticket is not None:
                self.ticket.cancel()


def _state_of(members: list[dict[str, Any]]) -> str:
    return "ok" if all(member["state"] == "ok" for member in members) else "degraded"


def _api_error_of(error: BaseException) -> ApiError:
    if isinstance(error, RequestTimeout):
        return ApiError(504, str(error), kind="timeout_error", code="timeout")
    if isinstance(error, ShuttingDown):
        return ApiError(503, str(error), kind="server_error", code="shutting_down")
    if isinstance(error, (ConfigError, TemplateError)):
        return ApiError(400, str(error))
    if isinstance(error, MemberFailedError):
        return ApiError(503, str(error), kind="server_error", code="member_failed")
    if isinstance(error, EnsembleError):
        return ApiError(503, str(error), kind="server_error")
    return ApiError(500, f"Generation failed: {type(error).__name__}: {error}", kind="server_error")


async def _whole_reply(chunks: _Deliveries, chat: ChatRequest, request: Request) -> Reply:
    """The whole reply; a client that goes away before it is whole stops its generation
    (looked for twice a second: a streaming reply learns of it from the connection itself)."""
    assembling = asyncio.ensure_future(_assemble(chunks, chat))
    while True:
        done, _ = await asyncio.wait({assembling}, timeout=_DISCONNECT_POLL_SECONDS)
        if done:
            return assembling.result()
        if await request.is_disconnected():
            assembling.cancel()  # ends the delivery loop, which cancels the ticket
            raise ApiError(499, "The client closed the connection before the reply was whole.")


async def _assemble(chunks: _Deliveries, chat: ChatRequest) -> Reply:
    assembler = ReplyAssembler(chat)
    async for chunk in chunks:
        assembler.feed(chunk)
    if assembler.reply is None:
        raise ApiError(500, "The generation ended without a result.", kind="server_error")
    return assembler.reply


async def _events(
    chunks: _Deliveries, chat: ChatRequest, completion_id: str, model: str, include_usage: bool, *, as_chat: bool
) -> AsyncIterator[dict[str, str]]:
    """Server-sent events of one reply: chat chunks (text and whole tool calls as deltas) or
    raw-text completion chunks; then the finish with the report, the usage if asked, [DONE]."""

    def chunk_of(content: Any = None, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        if as_chat:
            return wire.chat_chunk(completion_id, model, content or {}, finish_reason, **extra)
        return wire.text_chunk(completion_id, model, content or "", finish_reason, **extra)

    assembler = ReplyAssembler(chat)
    if as_chat:
        yield _event(chunk_of({"role": "assistant", "content": ""}))
    try:
        async for chunk in chunks:
            events = assembler.feed(chunk)  # the raw text of a completion goes out as it comes
            pieces = [wire.chat_delta(e) for e in events] if as_chat else [chunk.text]
            for piece in pieces:
                if piece:
                    yield _event(chunk_of(piece))
    except ApiError as error:
        yield _event(error.body)
        return
    reply = assembler.reply
    if reply is None:
        return
    yield _event(chunk_of(None, reply.finish_reason, **{wire.EXTENSION_FIELD: wire.extension(reply)}))
    if include_usage:
        yield _event({**chunk_of(), "choices": [], "usage": reply.usage.headline()})
    yield {"data": "[DONE]"}


def _event(payload: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(payload, ensure_ascii=False)}
