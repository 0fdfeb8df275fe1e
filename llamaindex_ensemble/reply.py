"""The core's reply (`ensemble_core.chat.reply`) as LlamaIndex responses.

The reply is read (text, tool calls, finish reason) by the core's one reply assembler, the
path the LangChain adapter uses too, so a reply means the same thing in both frameworks.
Calls become `ToolCallBlock`s in the assistant message, where LlamaIndex's agents and memory
look for them.
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

from ensemble_core.chat.reply import Reply, ReplyAssembler, TextDelta
from ensemble_core.chat.tool_calls import InvalidToolCall, ToolCall
from ensemble_core.results import StreamChunk


def chat_response(reply: Reply, model_name: str) -> ChatResponse:
    """The whole reply as one `ChatResponse`: text and tool-call blocks, usage and ensemble stats."""
    message = assistant_message(reply.content, reply.tool_calls, reply.invalid_tool_calls)
    return ChatResponse(message=message, raw=raw_response(reply, model_name), additional_kwargs=reply.usage.headline())


def streamed_response(assembler: ReplyAssembler, chunk: StreamChunk, model_name: str) -> ChatResponse | None:
    """The response for one core chunk: `delta` is the new text, `message` the reply so far.

    None while the chunk settles nothing (text that could start a tool call is held back; a
    call appears once whole). The last response carries `raw` and the token counts.
    """
    events = assembler.feed(chunk)
    reply = assembler.reply
    if reply is None and not events:
        return None
    delta = "".join(event.text for event in events if isinstance(event, TextDelta))
    message = assistant_message(assembler.text, assembler.tool_calls, assembler.invalid_tool_calls)
    if reply is None:
        return ChatResponse(message=message, delta=delta)
    return ChatResponse(
        message=message, delta=delta, raw=raw_response(reply, model_name), additional_kwargs=reply.usage.headline()
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


def raw_response(reply: Reply, model_name: str) -> dict[str, Any]:
    """JSON-friendly: why the reply ended, usage (with every member's own counts), ensemble stats.

    `usage` has the key names LlamaIndex's `TokenCountingHandler` reads.
    """
    members = {
        name: {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
        for name, u in reply.usage.members.items()
    }
    return {
        "model": model_name,
        "finish_reason": reply.finish_reason,
        "ensemble_finish_reason": reply.result.finish_reason,
        "usage": {**reply.usage.headline(), "counted_by": reply.usage.counted_by, "members": members},
        "ensemble": reply.summary(),
    }


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
