"""LangChain messages and tools -> the plain message dicts the core renders with each template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from ensemble_core.chat.conversation import text_content
from ensemble_core.errors import ConfigError

_ROLES: dict[type[BaseMessage], str] = {
    SystemMessage: "system",
    HumanMessage: "user",
    AIMessage: "assistant",
    ToolMessage: "tool",
    FunctionMessage: "tool",
}


def to_core_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """One `{"role", "content", ...}` dict per message (tool calls and results kept)."""
    return [_to_core(message, index) for index, message in enumerate(messages)]


def _to_core(message: BaseMessage, index: int) -> dict[str, Any]:
    role = message.role if isinstance(message, ChatMessage) else _role_of(message, index)
    item: dict[str, Any] = {"role": role, "content": text_content(message.content, f"messages[{index}]")}
    if message.name:
        item["name"] = message.name
    if isinstance(message, AIMessage) and message.tool_calls:
        item["tool_calls"] = [
            {"id": call.get("id"), "type": "function", "function": {"name": call["name"], "arguments": call["args"]}}
            for call in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        item["tool_call_id"] = message.tool_call_id
        if message.status == "error" and not item["content"].lower().startswith("error"):
            item["content"] = f"Error: {item['content']}"
    return item


def _role_of(message: BaseMessage, index: int) -> str:
    for kind, role in _ROLES.items():
        if isinstance(message, kind):
            return role
    raise ConfigError(
        f"`messages[{index}]` is a {type(message).__name__}, which ChatEnsemble cannot place in a conversation; "
        "use SystemMessage, HumanMessage, AIMessage, ToolMessage or ChatMessage(role=...)."
    )
