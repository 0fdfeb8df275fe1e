"""LlamaIndex messages and tools -> the plain message dicts the core renders with each template."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    ContentBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from ensemble_core.chat.conversation import text_content
from ensemble_core.errors import ConfigError

# LlamaIndex has provider-specific names for the three roles a chat template knows.
_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


def to_core_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """One `{"role", "content", ...}` dict per message (tool calls and tool results kept)."""
    if isinstance(messages, ChatMessage | str) or not isinstance(messages, Sequence):
        raise ConfigError(f"`messages` must be a list of ChatMessage, but is {type(messages).__name__}.")
    return [_to_core(message, index) for index, message in enumerate(messages)]


def _to_core(message: ChatMessage, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, ChatMessage):
        raise ConfigError(f"`{where}` must be a llama_index ChatMessage, but is {type(message).__name__}.")
    item: dict[str, Any] = {"role": _ROLES[message.role], "content": _text(message.blocks, where)}
    calls = _tool_calls(message)
    if calls:
        item["tool_calls"] = calls
    extra = message.additional_kwargs
    if item["role"] == "tool":
        # FunctionAgent and the OpenAI-style integrations keep the id here.
        item["tool_call_id"] = extra.get("tool_call_id")
    if isinstance(extra.get("name"), str):
        item["name"] = extra["name"]
    return item


def _text(blocks: Sequence[ContentBlock], where: str) -> str:
    """The text of the blocks; a non-text block (an image, audio, a document) is a `ConfigError`."""
    parts: list[Any] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCallBlock | ThinkingBlock):
            parts.append({"type": block.block_type})  # calls travel in `tool_calls`; reasoning is not re-sent
        elif not isinstance(block, CachePoint):  # a provider-side caching marker: nothing to read
            parts.append({"type": block.block_type})
    return text_content(parts, where)


def _tool_calls(message: ChatMessage) -> list[dict[str, Any]]:
    """The assistant's calls: `ToolCallBlock`s, or OpenAI-style `additional_kwargs["tool_calls"]`."""
    calls = [
        _call_dict(block.tool_call_id, block.tool_name, block.tool_kwargs)
        for block in message.blocks
        if isinstance(block, ToolCallBlock)
    ]
    if calls:
        return calls
    for call in message.additional_kwargs.get("tool_calls") or []:
        if hasattr(call, "model_dump"):  # an OpenAI SDK object
            call = call.model_dump()
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            calls.append(_call_dict(call.get("id"), function["name"], function.get("arguments", {})))
    return calls


def _call_dict(call_id: str | None, name: str, arguments: Mapping[str, Any] | str) -> dict[str, Any]:
    if isinstance(arguments, str):  # JSON text (streamed or OpenAI-style); kept as written if it is not JSON
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments) if arguments.strip() else {}
    if isinstance(arguments, Mapping):
        arguments = dict(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def to_openai_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """LlamaIndex tools (or OpenAI-style dicts, kept as they are) -> OpenAI-style tool dicts."""
    if not tools:
        return None
    converted = []
    for index, tool in enumerate(tools):
        metadata = getattr(tool, "metadata", None)
        if hasattr(metadata, "to_openai_tool"):
            converted.append(metadata.to_openai_tool(skip_length_check=True))
        elif isinstance(tool, Mapping):
            converted.append(dict(tool))
        else:
            raise ConfigError(
                f"`tools[{index}]` must be a LlamaIndex tool (e.g. FunctionTool.from_defaults(fn)) or an "
                f"OpenAI-style tool dict, but is {type(tool).__name__}."
            )
    return converted
