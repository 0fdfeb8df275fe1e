"""One chat call: the request handed to the core, and the reply turned into LangChain messages."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk

from ensemble_core.conversation import with_system_note
from ensemble_core.request import ChatRequest
from ensemble_core.results import GenerationResult, StreamChunk
from ensemble_core.tool_calls import (
    InvalidToolCall,
    ParsedReply,
    StreamEvent,
    ToolCall,
    ToolCallStream,
    parse_reply,
    plan_tools,
)
from langchain_ensemble.messages import to_core_messages

PROVIDER = "ensemble-llm"
_JSON_OBJECT_NOTE = "Reply with one JSON object and nothing else: no prose, no code fence."


def build_request(
    messages: list[BaseMessage],
    settings: dict[str, Any],
    options: dict[str, Any],
    pick_tool: Callable[[list[dict[str, Any]], list[dict[str, Any]]], str],
) -> ChatRequest:
    """The core request for `messages` with call `options` (tools, tool_choice, response_format).

    A call of "any" of several tools is settled first by `pick_tool(prompt, tools)` (the
    ensemble scores the names; a small model left to write one may invent it), then that
    tool's call is forced. Messages are converted (and rejected) before anything is loaded.
    """
    prompt = to_core_messages(messages)
    plan = plan_tools(
        options.get("tools"),
        options.get("tool_choice"),
        parallel_calls=options.get("parallel_tool_calls") is not False,
        stop=settings.get("stop") or [],
        pick_tool=lambda tools: pick_tool(prompt, tools),
    )
    prefix = plan.reply_prefix
    response_format = options.get("response_format")
    if response_format is not None:
        note, opening = _json_reply(response_format)
        prompt = with_system_note(prompt, note)
        prefix = prefix or opening
    return ChatRequest(prompt, {**settings, "stop": plan.stop}, plan.tools, prefix)


def _json_reply(response_format: dict[str, Any]) -> tuple[str, str]:
    """The system note asking for JSON, and the reply's forced opening.

    A schema is described as its keys with their types: small models shown a raw JSON
    schema tend to echo its `title`/`properties` shape back. The opening writes the first
    key (and the quote of its value when that is a string), so the object starts right.
    """
    kind = response_format.get("type")
    if kind == "json_object":
        return _JSON_OBJECT_NOTE, "{"
    schema = response_format.get("schema") or (response_format.get("json_schema") or {}).get("schema")
    if kind != "json_schema" or not isinstance(schema, dict):
        raise ValueError(
            "`response_format` must be {'type': 'json_object'} or {'type': 'json_schema', 'schema': {...}}, "
            f"but is {response_format!r}"
        )
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return f"{_JSON_OBJECT_NOTE} It must follow this JSON schema:\n{json.dumps(schema)}", "{"
    required = set(schema.get("required", ()))
    lines = [
        f'- "{key}": {spec.get("type", "any") if isinstance(spec, dict) else "any"}'
        f"{'' if key in required else ' (optional)'}"
        f"{': ' + spec['description'] if isinstance(spec, dict) and spec.get('description') else ''}"
        for key, spec in properties.items()
    ]
    note = f"{_JSON_OBJECT_NOTE} The object has these keys:\n" + "\n".join(lines)
    first, first_spec = next(iter(properties.items()))
    string_value = isinstance(first_spec, dict) and first_spec.get("type") == "string"
    return note, '{"' + first + '": ' + ('"' if string_value else "")


def final_message(request: ChatRequest, result: GenerationResult, model_name: str) -> AIMessage:
    """The whole reply as one `AIMessage` (content, tool calls, usage, metadata)."""
    parsed = parse_reply(request.reply_prefix + result.text, request.tool_names)
    return AIMessage(
        content=parsed.content,
        tool_calls=[_tool_call(c) for c in parsed.tool_calls],
        invalid_tool_calls=[_invalid_call(c) for c in parsed.invalid_tool_calls],
        usage_metadata=usage_metadata(result),
        response_metadata=response_metadata(result, model_name, parsed),
    )


def usage_metadata(result: GenerationResult) -> UsageMetadata:
    """Counts in the tokens of the method's reference member (see `Usage.counted_by`)."""
    usage = result.usage
    return UsageMetadata(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
    )


def response_metadata(result: GenerationResult, model_name: str, parsed: ParsedReply) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "model_provider": PROVIDER,
        "finish_reason": result.api_finish_reason(bool(parsed.tool_calls)),
        "ensemble_finish_reason": result.finish_reason,
        "usage_counted_by": result.usage.counted_by,
        "ensemble": result.summary(),
    }


def _tool_call(call: ToolCall) -> Any:
    return tool_call(name=call.name, args=call.arguments, id=call.id)


def _invalid_call(call: InvalidToolCall) -> Any:
    return invalid_tool_call(name=call.name, args=call.arguments or call.text, id=call.id, error=call.error)


class StreamedReply:
    """Core stream chunks -> `ChatGenerationChunk`s: text as it comes, each tool call once whole.

    Usage and metadata go on the last chunk only, so adding the chunks up counts the input
    tokens once.
    """

    def __init__(self, request: ChatRequest, model_name: str):
        self._request = request
        self._model_name = model_name
        self._splitter = ToolCallStream(request.tool_names)
        self._waiting = self._splitter.feed(request.reply_prefix) if request.reply_prefix else []
        self._calls = 0
        self.result: GenerationResult | None = None

    def chunks(self, core_chunk: StreamChunk) -> list[ChatGenerationChunk]:
        events = [*self._waiting, *self._splitter.feed(core_chunk.text)]
        self._waiting = []
        if core_chunk.result is not None:
            events += self._splitter.finish()
        out = [self._event_chunk(event) for event in events if event.text or event.call or event.invalid]
        if core_chunk.result is not None:
            self.result = core_chunk.result
            parsed = parse_reply(self._request.reply_prefix + core_chunk.result.text, self._request.tool_names)
            last = AIMessageChunk(
                content="",
                usage_metadata=usage_metadata(core_chunk.result),
                response_metadata=response_metadata(core_chunk.result, self._model_name, parsed),
                chunk_position="last",
            )
            out.append(
                ChatGenerationChunk(
                    message=last, generation_info={"finish_reason": last.response_metadata["finish_reason"]}
                )
            )
        return out

    def _event_chunk(self, event: StreamEvent) -> ChatGenerationChunk:
        if event.call is not None:
            piece = tool_call_chunk(
                name=event.call.name, args=event.call.arguments_json, id=event.call.id, index=self._next_index()
            )
            return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[piece]))
        if event.invalid is not None:
            bad = _invalid_call(event.invalid)
            return ChatGenerationChunk(message=AIMessageChunk(content="", invalid_tool_calls=[bad]))
        return ChatGenerationChunk(message=AIMessageChunk(content=event.text))

    def _next_index(self) -> int:
        self._calls += 1
        return self._calls - 1
