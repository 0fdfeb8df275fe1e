"""One chat call: the request handed to the core, and the reply turned into LlamaIndex responses.

Tool calls are read by `ensemble_core.tool_calls` (the parser the LangChain adapter uses too),
so a reply means the same thing in both frameworks. They become `ToolCallBlock`s in the
assistant message, the place LlamaIndex's agents and memory look for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ContentBlock,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection

from ensemble_core.request import ChatRequest
from ensemble_core.results import GenerationResult, StreamChunk
from ensemble_core.tool_calls import (
    InvalidToolCall,
    ToolCall,
    ToolCallStream,
    parse_reply,
)


def chat_response(request: ChatRequest, result: GenerationResult, model_name: str) -> ChatResponse:
    """The whole reply as one `ChatResponse`: text and tool-call blocks, usage and ensemble stats."""
    parsed = parse_reply(request.reply_prefix + result.text, request.tool_names)
    message = assistant_message(parsed.content, parsed.tool_calls, parsed.invalid_tool_calls)
    return ChatResponse(
        message=message,
        raw=raw_response(result, model_name, bool(parsed.tool_calls)),
        additional_kwargs=token_counts(result),
    )


def assistant_message(text: str, calls: Sequence[ToolCall], invalid: Sequence[InvalidToolCall]) -> ChatMessage:
    """An assistant message; badly written calls go to `additional_kwargs["invalid_tool_calls"]`."""
    blocks: list[ContentBlock] = [TextBlock(text=text)]
    blocks += [ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in calls]
    extra: dict[str, Any] = {}
    if invalid:
        extra["invalid_tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments, "text": c.text, "error": c.error} for c in invalid
        ]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=extra)


def token_counts(result: GenerationResult) -> dict[str, int]:
    """The headline counts, in the tokens of the method's reference member (see `Usage.counted_by`)."""
    usage = result.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def raw_response(result: GenerationResult, model_name: str, called_tools: bool) -> dict[str, Any]:
    """JSON-friendly: why the reply ended, usage (with every member's own counts), ensemble stats.

    `usage` has the key names LlamaIndex's `TokenCountingHandler` reads.
    """
    members = {
        name: {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
        for name, u in result.usage.members.items()
    }
    return {
        "model": model_name,
        "finish_reason": result.api_finish_reason(called_tools),
        "ensemble_finish_reason": result.finish_reason,
        "usage": {**token_counts(result), "counted_by": result.usage.counted_by, "members": members},
        "ensemble": result.summary(),
    }


class StreamedReply:
    """Core stream chunks -> `ChatResponse`s: `delta` is the new text, `message` the reply so far.

    Text is released as soon as it cannot be the start of a tool call; a call appears in the
    message (as a `ToolCallBlock`) once it is whole. The last response carries `raw` (usage and
    ensemble stats) and the token counts.
    """

    def __init__(self, request: ChatRequest, model_name: str):
        self._model_name = model_name
        self._splitter = ToolCallStream(request.tool_names)
        self._waiting = self._splitter.feed(request.reply_prefix) if request.reply_prefix else []
        self._text = ""
        self._calls: list[ToolCall] = []
        self._invalid: list[InvalidToolCall] = []

    def feed(self, chunk: StreamChunk) -> ChatResponse | None:
        """The response for one core chunk (None when it released nothing yet)."""
        events = [*self._waiting, *self._splitter.feed(chunk.text)]
        self._waiting = []
        if chunk.result is not None:
            events += self._splitter.finish()
        delta = "".join(event.text for event in events)
        self._text += delta
        self._calls += [event.call for event in events if event.call is not None]
        self._invalid += [event.invalid for event in events if event.invalid is not None]
        if chunk.result is None and not delta and not any(e.call or e.invalid for e in events):
            return None
        message = assistant_message(self._text, self._calls, self._invalid)
        if chunk.result is None:
            return ChatResponse(message=message, delta=delta)
        return ChatResponse(
            message=message,
            delta=delta,
            raw=raw_response(chunk.result, self._model_name, bool(self._calls)),
            additional_kwargs=token_counts(chunk.result),
        )


def first_call_only(response: ChatResponse) -> ChatResponse:
    """The response with its tool calls cut to the first (when parallel calls were not allowed)."""
    calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
    if len(calls) < 2:
        return response
    blocks = [b for b in response.message.blocks if not isinstance(b, ToolCallBlock) or b is calls[0]]
    message = response.message.model_copy(update={"blocks": blocks})
    return response.model_copy(update={"message": message})


def tool_selections(response: ChatResponse, error_on_no_tool_call: bool) -> list[ToolSelection]:
    """The response's tool calls as `ToolSelection`s (what agents and `predict_and_call` run)."""
    selections = [
        ToolSelection(tool_id=block.tool_call_id or "", tool_name=block.tool_name, tool_kwargs=block.tool_kwargs)
        for block in response.message.blocks
        if isinstance(block, ToolCallBlock)
    ]
    if selections or not error_on_no_tool_call:
        return selections
    invalid = response.message.additional_kwargs.get("invalid_tool_calls") or []
    if invalid:
        reasons = "; ".join(f"{c.get('text')!r}: {c.get('error')}" for c in invalid)
        raise ValueError(f"Expected a tool call, but the model wrote only invalid ones: {reasons}")
    raise ValueError(
        f"Expected a tool call, but the model answered in text: {response.message.content or ''!r:.200}. "
        "Pass tool_required=True (or tool_choice=<tool name>) to make it call a tool."
    )
