"""A conversation made fit for one member's chat template, without writing a template by hand.

Frameworks send what real chats contain: multi-part text, tool definitions, assistant turns
that call tools, tool results, two messages of one role in a row. Templates differ in what
they accept: Qwen's renders tools, tool calls and tool results; SmolLM2's silently drops
tools and tool calls; Gemma's rejects two user turns in a row. So each member's template is
PROBED once for what it renders (`TemplateAbilities`), and only what it cannot render is
rewritten, in the same Hermes format the tool-call parser reads (`ensemble_core.chat.tool_calls`):

* tools the template ignores -> a tools section in the system message;
* assistant tool calls it ignores -> `<tool_call>{json}</tool_call>` text in the turn;
* tool results it cannot show -> a user turn with `<tool_response>` text.

Consecutive messages of one role are merged only when the template rejects them as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from ensemble_core.chat.tool_calls import CALL_CLOSE, CALL_OPEN
from ensemble_core.errors import ConfigError

_PROBE_NAME = "zq_probe_tool"
_PROBE_TEXT = "ZqProbeResult"
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": _PROBE_NAME, "description": "probe", "parameters": {"type": "object", "properties": {}}},
}
_TEMPLATE_ERRORS = (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError)


@dataclass(frozen=True)
class TemplateAbilities:
    """What a chat template renders (probed by rendering tiny conversations)."""

    tools: bool
    tool_calls: bool
    tool_results: bool


_abilities_by_template: dict[str, TemplateAbilities] = {}


def template_abilities(tokenizer: Any) -> TemplateAbilities:
    """Probe (once per distinct template text) what `tokenizer`'s chat template can show."""
    template = str(tokenizer.chat_template)
    if template not in _abilities_by_template:
        user = {"role": "user", "content": "hi"}
        call = {"role": "assistant", "content": "", "tool_calls": [_tool_call_dict("c1", _PROBE_NAME, {})]}
        result = {"role": "tool", "content": _PROBE_TEXT, "tool_call_id": "c1", "name": _PROBE_NAME}
        _abilities_by_template[template] = TemplateAbilities(
            tools=_PROBE_NAME in _try_render(tokenizer, [user], [_PROBE_TOOL]),
            tool_calls=_PROBE_NAME in _try_render(tokenizer, [user, call]),
            tool_results=_PROBE_TEXT in _try_render(tokenizer, [user, call, result]),
        )
    return _abilities_by_template[template]


def _try_render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    except _TEMPLATE_ERRORS:
        return ""


def _tool_call_dict(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": dict(arguments)}}


def text_content(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (joined with newlines).

    Raises:
        ConfigError: a part that is not text (an image, audio, a file): text-only members
            cannot read it, and dropping it silently would change the question.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise ConfigError(
            f"`{where}` content must be a string or a list of text parts, but is {type(content).__name__}."
        )
    texts = []
    for index, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, Mapping) and part.get("type") in ("tool_use", "tool_call", "reasoning", "thinking"):
            continue  # tool calls travel in `tool_calls`; hidden reasoning is not shown to the next turn
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ConfigError(
                f"`{where}` content part {index} is of type {kind!r}; the members read text only. "
                "Describe the content in text, or remove the part."
            )
    return "\n".join(texts)


def fit_conversation(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools to hand to this tokenizer's template (copies; inputs untouched)."""
    abilities = template_abilities(tokenizer)
    fitted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        item = {k: v for k, v in message.items() if k != "content"}
        item["content"] = text_content(message.get("content"), f"prompt[{index}]")
        if item.get("tool_calls"):
            item["tool_calls"] = [dict(c) for c in item["tool_calls"]]
            if not abilities.tool_calls:
                item["content"] = _join(item["content"], _calls_as_text(item.pop("tool_calls")))
        if item["role"] == "tool" and not abilities.tool_results:
            item = {"role": "user", "content": f"<tool_response>\n{item['content']}\n</tool_response>"}
        fitted.append(item)
    if tools and not abilities.tools:
        return with_system_note(fitted, tools_instructions(tools)), None
    return fitted, [dict(t) for t in tools] if tools else None


def merge_consecutive_roles(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with runs of one role (tool results excepted) joined into one message."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if previous is not None and previous["role"] == message["role"] and message["role"] != "tool":
            previous["content"] = _join(previous["content"], message["content"])
            if message.get("tool_calls"):
                previous["tool_calls"] = [*previous.get("tool_calls", []), *message["tool_calls"]]
        else:
            merged.append(dict(message))
    return merged


def _calls_as_text(calls: list[Mapping[str, Any]]) -> str:
    blocks = []
    for call in calls:
        function = call.get("function", call)
        call_object = {"name": function.get("name"), "arguments": function.get("arguments", {})}
        body = json.dumps(call_object, ensure_ascii=False)
        blocks.append(f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
    return "\n".join(blocks)


def tools_instructions(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools section for templates that do not render tools (the format the parser reads)."""
    signatures = "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to help with the user's request. "
        f"The functions, one JSON signature per line:\n<tools>\n{signatures}\n</tools>\n\n"
        "To call a function, reply with a JSON object naming it and giving its arguments, "
        f'inside tags:\n{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_CLOSE}'
    )


def with_system_note(messages: Sequence[Mapping[str, Any]], note: str) -> list[dict[str, Any]]:
    """`messages` with `note` added to the system message (one is put first if there is none)."""
    copied = [dict(m) for m in messages]
    if copied and copied[0]["role"] == "system":
        first = text_content(copied[0].get("content"), "prompt[0]")
        return [{**copied[0], "content": _join(first, note)}, *copied[1:]]
    return [{"role": "system", "content": note}, *copied]


def _join(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if first and second else first or second
