"""The OpenAI wire format: request bodies -> the core's messages and options, replies -> JSON.

Pure functions (no HTTP, no models), so every rule about the format is checked in one place
and tested without a server. What the API offers and the ensemble cannot do (`n` > 1,
logprobs, penalties, images) is refused with an `ApiError` naming the field, never ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ensemble_core.chat.reply import InvalidToolCallEvent, Reply, ReplyEvent, TextDelta, ToolCallEvent
from ensemble_core.chat.tool_calls import ToolCall

EXTENSION_FIELD = "ensemble"
"""Where every reply carries the ensemble's report (`GenerationResult.summary`: method, share
ensembled, per-member seconds and usage), and the calls the model wrote wrongly."""

_SHARED_FIELDS = {
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "user",
    "logprobs",
    "frequency_penalty",
    "presence_penalty",
}
_CHAT_FIELDS = _SHARED_FIELDS | {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "max_completion_tokens",
    "metadata",
    "store",
}
_COMPLETION_FIELDS = _SHARED_FIELDS | {"prompt", "echo", "best_of", "suffix"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ApiError(Exception):
    """A request the server refuses, in the OpenAI error shape (`body`) with its HTTP status
    (and headers: clients retry a 429 after `retry-after`, and never retry a 504 that already
    used up its time, `x-should-retry: false`, which the openai client obeys)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        retry = {429: {"retry-after": "1"}, 503: {"retry-after": "5"}, 504: {"x-should-retry": "false"}}
        self.headers = retry.get(status, {})


@dataclass(frozen=True)
class ParsedCall:
    """One API call, read: what `build_request` takes, and how to answer."""

    messages: list[dict[str, Any]] | str  # core messages (chat) or the raw prompt (completions)
    options: dict[str, Any]  # core names: max_new_tokens, stop, temperature, tools, ...
    stream: bool
    include_usage: bool


def read_chat_body(body: Mapping[str, Any], *, served: str, default_tokens: int, max_tokens: int) -> ParsedCall:
    """A `/v1/chat/completions` body, checked; `served` is the model id this server answers to."""
    _check_fields(body, _CHAT_FIELDS)
    _check_model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty list of messages.", param="messages")
    options = _shared_options(body, default_tokens, max_tokens, token_fields=("max_completion_tokens", "max_tokens"))
    for name in ("tools", "tool_choice", "parallel_tool_calls", "response_format"):
        if body.get(name) is not None:
            options[name] = body[name]
    if body.get("logprobs"):
        raise ApiError(
            400, "`logprobs` is not supported by an ensemble (its tokens are no one model's).", param="logprobs"
        )
    core = [_core_message(m, i) for i, m in enumerate(messages)]
    return ParsedCall(core, options, _streams(body), _include_usage(body))


def read_completion_body(body: Mapping[str, Any], *, served: str, default_tokens: int, max_tokens: int) -> ParsedCall:
    """A `/v1/completions` body, checked (one prompt string per call)."""
    _check_fields(body, _COMPLETION_FIELDS)
    _check_model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(
            400, "`prompt` must be one non-empty string (send several prompts as several requests).", param="prompt"
        )
    for name in ("echo", "suffix", "logprobs"):
        if body.get(name):
            raise ApiError(400, f"`{name}` is not supported by this server.", param=name)
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "`best_of` must be 1.", param="best_of")
    options = _shared_options(body, default_tokens, max_tokens, token_fields=("max_tokens",))
    return ParsedCall(prompt, options, _streams(body), _include_usage(body))


def _check_fields(body: Mapping[str, Any], known: set[str]) -> None:
    if not isinstance(body, Mapping):
        raise ApiError(400, "The request body must be a JSON object.")
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"Unknown or unsupported fields {unknown}; supported: {sorted(known)}.", param=unknown[0])


def _check_model(body: Mapping[str, Any], served: str) -> None:
    model = body.get("model")
    if model is not None and model != served:
        raise ApiError(
            404,
            f"The model {model!r} is not served here; this server serves {served!r} (GET /v1/models).",
            param="model",
            code="model_not_found",
        )


def _shared_options(
    body: Mapping[str, Any], default_tokens: int, max_tokens: int, token_fields: tuple[str, ...]
) -> dict[str, Any]:
    if body.get("n") not in (None, 1):
        raise ApiError(400, "`n` must be 1: an ensemble writes one answer per request.", param="n")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise ApiError(400, f"`{name}` is not supported by this server; leave it out or 0.", param=name)
    limit = next((body[name] for name in token_fields if body.get(name) is not None), default_tokens)
    field = next((name for name in token_fields if body.get(name) is not None), token_fields[-1])
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ApiError(400, f"`{field}` must be a positive integer, but is {limit!r}.", param=field)
    if limit > max_tokens:
        raise ApiError(400, f"`{field}`={limit} is above this server's cap of {max_tokens} tokens.", param=field)
    options: dict[str, Any] = {"max_new_tokens": limit}
    for name in ("temperature", "top_p", "seed", "stop"):
        if body.get(name) is not None:
            options[name] = body[name]
    return options


def _streams(body: Mapping[str, Any]) -> bool:
    """`stream`: true, false or absent (the string "false" would read as true)."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, f"`stream` must be true or false, but is {stream!r}.", param="stream")
    return bool(stream)


def _include_usage(body: Mapping[str, Any]) -> bool:
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise ApiError(400, "`stream_options` must be an object.", param="stream_options")
    return bool((stream_options or {}).get("include_usage"))


def _core_message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or message["role"] not in _ROLES:
        raise ApiError(400, f"`{where}` must be an object with a role in {sorted(_ROLES)}.", param=where)
    item: dict[str, Any] = {"role": _ROLES[message["role"]], "content": _text(message.get("content"), where)}
    if message.get("name"):
        item["name"] = message["name"]
    if message.get("tool_call_id"):
        item["tool_call_id"] = message["tool_call_id"]
    calls = message.get("tool_calls")
    if calls:
        item["tool_calls"] = [_core_call(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(calls)]
    return item


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(
                    400,
                    f"`{where}.content[{k}]` is not a text part; the ensemble reads text only.",
                    param=f"{where}.content",
                )
            texts.append(part["text"])
        return "\n".join(texts)  # as `Ensemble.generate` and both adapters join a message's text parts
    raise ApiError(400, f"`{where}.content` must be a string or a list of text parts.", param=f"{where}.content")


def _core_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ApiError(
            400, f"`{where}` must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}.", param=where
        )
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ApiError(400, f"`{where}.function.arguments` is not valid JSON.", param=where) from None
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


# ---------------------------------------------------------------------- replies


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def extension(reply: Reply) -> dict[str, Any]:
    """The report that rides along under `EXTENSION_FIELD`."""
    report = reply.summary()
    report["usage_counted_by"] = reply.usage.counted_by
    report["invalid_tool_calls"] = [
        {"text": c.text, "error": c.error, "name": c.name} for c in reply.invalid_tool_calls
    ]
    return report


def call_body(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }
    if index is not None:
        body["index"] = index
    return body


def envelope(kind: str, completion_id: str, model: str, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One reply object of `kind` ("chat.completion", "chat.completion.chunk", "text_completion")."""
    return {
        "id": completion_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, **choice, "logprobs": None}],
        **extra,
    }


def chat_completion(reply: Reply, completion_id: str, model: str) -> dict[str, Any]:
    content = reply.content if reply.content or not reply.tool_calls else None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reply.tool_calls:
        message["tool_calls"] = [call_body(c) for c in reply.tool_calls]
    choice = {"message": message, "finish_reason": reply.finish_reason}
    return envelope("chat.completion", completion_id, model, choice, **_closing(reply))


def chat_chunk(
    completion_id: str, model: str, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice = {"delta": delta, "finish_reason": finish_reason}
    return envelope("chat.completion.chunk", completion_id, model, choice, **extra)


def chat_delta(event: ReplyEvent) -> dict[str, Any] | None:
    """The `delta` of a chunk for one reply event (an invalid call goes into the report instead)."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ToolCallEvent):
        return {"tool_calls": [call_body(event.call, event.index)]}
    if isinstance(event, InvalidToolCallEvent):
        return None
    raise TypeError(f"unknown reply event {event!r}")


def text_completion(reply: Reply, completion_id: str, model: str) -> dict[str, Any]:
    choice = {"text": reply.result.text, "finish_reason": reply.finish_reason}
    return envelope("text_completion", completion_id, model, choice, **_closing(reply))


def text_chunk(
    completion_id: str, model: str, text: str, finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    return envelope("text_completion", completion_id, model, {"text": text, "finish_reason": finish_reason}, **extra)


def _closing(reply: Reply) -> dict[str, Any]:
    return {"usage": reply.usage.headline(), EXTENSION_FIELD: extension(reply)}
