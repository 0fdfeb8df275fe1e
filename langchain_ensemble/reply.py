"""The core's reply (`ensemble_core.chat.reply`) as LangChain messages and chunks.

Pure conversions: the reply is read (text, tool calls, finish reason) by the core's one reply
assembler, the path the LlamaIndex adapter uses too.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from ensemble_core.chat.reply import InvalidToolCallEvent, Reply, ReplyEvent, ToolCallEvent
from ensemble_core.chat.tool_calls import InvalidToolCall

PROVIDER = "ensemble-llm"


def chat_result(reply: Reply, model_name: str) -> ChatResult:
    """The whole reply as the one generation of a `ChatResult`."""
    message = ai_message(reply, model_name)
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info={"finish_reason": reply.finish_reason})],
        llm_output={"model_name": model_name},
    )


def ai_message(reply: Reply, model_name: str) -> AIMessage:
    """The whole reply as one `AIMessage` (content, tool calls, usage, metadata)."""
    return AIMessage(
        content=reply.content,
        tool_calls=[tool_call(name=c.name, args=c.arguments, id=c.id) for c in reply.tool_calls],
        invalid_tool_calls=[_invalid_call(c) for c in reply.invalid_tool_calls],
        usage_metadata=usage_metadata(reply),
        response_metadata=response_metadata(reply, model_name),
    )


def event_chunk(event: ReplyEvent) -> ChatGenerationChunk:
    """One streamed event as a chunk: text, a whole tool call, or an invalid call."""
    if isinstance(event, ToolCallEvent):
        call = event.call
        piece = tool_call_chunk(name=call.name, args=call.arguments_json, id=call.id, index=event.index)
        return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[piece]))
    if isinstance(event, InvalidToolCallEvent):
        return ChatGenerationChunk(message=AIMessageChunk(content="", invalid_tool_calls=[_invalid_call(event.call)]))
    return ChatGenerationChunk(message=AIMessageChunk(content=event.text))


def last_chunk(reply: Reply, model_name: str) -> ChatGenerationChunk:
    """The closing chunk: usage and metadata go here only, so adding the chunks up counts them once."""
    message = AIMessageChunk(
        content="",
        usage_metadata=usage_metadata(reply),
        response_metadata=response_metadata(reply, model_name),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info={"finish_reason": reply.finish_reason})


def usage_metadata(reply: Reply) -> UsageMetadata:
    """Counts in the tokens of the method's reference member (see `Usage.counted_by`)."""
    usage = reply.usage
    return UsageMetadata(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
    )


def response_metadata(reply: Reply, model_name: str) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "model_provider": PROVIDER,
        "finish_reason": reply.finish_reason,
        "ensemble_finish_reason": reply.result.finish_reason,
        "usage_counted_by": reply.usage.counted_by,
        "ensemble": reply.summary(),
    }


def _invalid_call(call: InvalidToolCall) -> Any:
    return invalid_tool_call(name=call.name, args=call.arguments or call.text, id=call.id, error=call.error)
