"""Tool calls in generated text: parsing a finished reply, and separating them while streaming.

Both framework adapters (LangChain, LlamaIndex) read tool calls through this one module, so a
reply means the same thing everywhere. Two formats are understood:

* the Hermes/Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any
  number of times, with free text around the blocks. An unclosed last block is read as if
  closed (a model may end its turn right after the JSON);
* a reply that is nothing but a JSON object (optionally inside a ```json fence) with a
  ``"name"`` of one of the offered tools and ``"arguments"`` (or ``"parameters"``), or a JSON
  list of such objects. Only offered tool names count here, so an ordinary JSON answer is
  never mistaken for a call.

A call a model writes badly (invalid JSON, no name, arguments that are not an object, a tool
that was not offered) becomes an `InvalidToolCall` carrying the raw text and the reason; it is
never an exception, so a chain or agent can show the model its mistake.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ensemble_core.constraints.kinds import Grammar, json_rule
from ensemble_core.errors import ConfigError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CLOSING_TAG = "</"
_FENCE = "```"
_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def new_call_id() -> str:
    """A fresh id in the format OpenAI-style clients expect (`call_` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model wrote correctly: `arguments` is the parsed JSON object."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class InvalidToolCall:
    """A tool call the model attempted but wrote wrongly.

    Attributes:
        text: what the model wrote for the call (the JSON part, as written).
        error: why it is not a valid call, in words a user (or the model) can act on.
        name: the tool name, when it could be read.
        arguments: the arguments as written (a string), when they could be located.
    """

    text: str
    error: str
    name: str | None = None
    arguments: str | None = None
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into the text meant for the user and the tool calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)


def parse_reply(text: str, tool_names: Collection[str] | None = None) -> ParsedReply:
    """Split `text` into content and tool calls (see the module docstring for the formats).

    Args:
        text: the generated reply.
        tool_names: the names of the tools that were offered; None means no tools were
            offered (then `<tool_call>` blocks are still read, and reported invalid).
    """
    names = set(tool_names) if tool_names is not None else None
    if CALL_OPEN in text:
        return _parse_tagged(text, names)
    if names:
        bare = _parse_bare_json(text, names)
        if bare is not None:
            return bare
    return ParsedReply(content=text)


def _parse_tagged(text: str, names: set[str] | None) -> ParsedReply:
    content_parts: list[str] = []
    read: list[ToolCall | InvalidToolCall] = []
    rest = text
    while CALL_OPEN in rest:
        before, _, after = rest.partition(CALL_OPEN)
        content_parts.append(before)
        body, closed, rest = after.partition(CALL_CLOSE)
        if not closed:
            rest = ""
        read.append(_read_call(body.strip(), names))
    content_parts.append(rest)
    return _reply("".join(content_parts).strip(), read)


def _reply(content: str, read: list[ToolCall | InvalidToolCall]) -> ParsedReply:
    calls = [c for c in read if isinstance(c, ToolCall)]
    return ParsedReply(content, calls, [c for c in read if isinstance(c, InvalidToolCall)])


def _parse_bare_json(text: str, names: set[str]) -> ParsedReply | None:
    """The reply as bare JSON call(s), or None when it is not one (then it is plain content)."""
    body = _strip_fence(text.strip().removesuffix(CALL_CLOSE).strip())  # a model may drop only the opening tag
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    objects = value if isinstance(value, list) else [value]
    if not objects or not all(isinstance(o, Mapping) and o.get("name") in names for o in objects):
        return None
    return _reply("", [_read_call(json.dumps(obj, ensure_ascii=False), names) for obj in objects])


def _strip_fence(text: str) -> str:
    if text.startswith(_FENCE) and text.endswith(_FENCE) and len(text) > 2 * len(_FENCE):
        inner = text[len(_FENCE) : -len(_FENCE)]
        first_line, _, remainder = inner.partition("\n")
        return remainder.strip() if first_line.strip().isalpha() or not first_line.strip() else inner.strip()
    return text


def _read_call(body: str, names: set[str] | None) -> ToolCall | InvalidToolCall:
    """One call read from its JSON `body`; `names` None means no tools were offered."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as error:
        name = match.group(1) if (match := _NAME.search(body)) else None
        return InvalidToolCall(body, f"the tool call is not valid JSON ({error})", name)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return InvalidToolCall(body, 'a tool call must be a JSON object with a string "name"')
    name = obj["name"]
    raw_arguments = obj.get("arguments", obj.get("parameters", {}))
    arguments = raw_arguments
    if isinstance(raw_arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = None
    arguments_text = raw_arguments if isinstance(raw_arguments, str) else json.dumps(raw_arguments, ensure_ascii=False)
    if not isinstance(arguments, Mapping):
        return InvalidToolCall(body, f'the "arguments" of {name!r} must be a JSON object', name, arguments_text)
    if names is None:
        return InvalidToolCall(body, f"the model called {name!r}, but no tools were offered", name, arguments_text)
    if name not in names:
        return InvalidToolCall(body, f"there is no tool named {name!r}; offered: {sorted(names)}", name, arguments_text)
    return ToolCall(name, dict(arguments))


@dataclass
class StreamEvent:
    """One thing the stream splitter releases: new text, or a finished tool call."""

    text: str = ""
    call: ToolCall | None = None
    invalid: InvalidToolCall | None = None


class ToolCallStream:
    """Separates tool calls from text while a reply streams in.

    Text is released as soon as it cannot be the start of a call; a `<tool_call>` block is
    held until it closes and released as one call. When tools were offered and the reply
    begins like bare JSON (`{`, `[` or a fence), everything is held to the end, because only
    the whole reply tells a JSON call from a JSON answer. `finish()` releases the rest.
    """

    def __init__(self, tool_names: Collection[str] | None = None):
        self._names = set(tool_names) if tool_names is not None else None
        self._pending = ""  # received, not released
        self._seen_text = False  # any non-whitespace text released or held as text
        self._holding_bare = False

    def feed(self, delta: str) -> list[StreamEvent]:
        self._pending += delta
        events: list[StreamEvent] = []
        while True:
            if self._holding_bare:
                return events
            if not self._seen_text and self._names:
                stripped = self._pending.lstrip()
                if not stripped:
                    return events
                if stripped[0] in "{[" or _FENCE.startswith(stripped[:3]):
                    self._holding_bare = True
                    return events
            start = self._pending.find(CALL_OPEN)
            if start < 0:
                keep = _partial_marker_length(self._pending)
                self._release_text(self._pending[: len(self._pending) - keep], events)
                self._pending = self._pending[len(self._pending) - keep :]
                return events
            self._release_text(self._pending[:start], events)
            end = self._pending.find(CALL_CLOSE, start)
            if end < 0:
                self._pending = self._pending[start:]
                return events
            events.extend(self._call_events(self._pending[start + len(CALL_OPEN) : end]))
            self._pending = self._pending[end + len(CALL_CLOSE) :]
            self._seen_text = True

    def finish(self) -> list[StreamEvent]:
        """Everything still held: an open call read as closed, bare JSON read as a whole."""
        pending, self._pending = self._pending, ""
        events: list[StreamEvent] = []
        if self._holding_bare and CALL_OPEN in pending:
            # As `parse_reply` reads it: tagged calls, with the JSON-looking start as text.
            self._holding_bare, self._seen_text = False, True
            return [*self.feed(pending), *self.finish()]
        if self._holding_bare:
            parsed = _parse_bare_json(pending, self._names or set())
            if parsed is None:
                return [StreamEvent(text=pending)]
            events.extend(StreamEvent(call=c) for c in parsed.tool_calls)
            events.extend(StreamEvent(invalid=c) for c in parsed.invalid_tool_calls)
            return events
        if pending.startswith(CALL_OPEN):
            return self._call_events(pending[len(CALL_OPEN) :])
        self._release_text(pending, events)
        return events

    def _release_text(self, text: str, events: list[StreamEvent]) -> None:
        if text:
            events.append(StreamEvent(text=text))
            self._seen_text = self._seen_text or bool(text.strip())

    def _call_events(self, body: str) -> list[StreamEvent]:
        read = _read_call(body.strip(), self._names)
        return [StreamEvent(call=read) if isinstance(read, ToolCall) else StreamEvent(invalid=read)]


def _partial_marker_length(text: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `<tool_call>`."""
    for size in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0


def forced_call_prefix(tools: Sequence[Mapping[str, Any]], choice: str) -> str:
    """The opening of a reply that makes the model call a tool (the rest it writes itself).

    Small models often answer in prose when told to call a tool, and write `{city: ...}`
    without quotes; starting their reply with the call's opening (in each member's own
    tokens), up to the quote of the first argument name when the tool takes arguments (the
    whole call when it takes none), leaves them little to get wrong. `tools` are OpenAI-style definitions; `choice` is a
    tool name, or "any" (one tool offered: that one; several: the model writes the name).
    """
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if choice == "any":
        if len(by_name) != 1:
            return f'{CALL_OPEN}\n{{"name": "'
        choice = next(iter(by_name))
    # A tool without declared arguments gets its (empty) arguments written for it: given a bare
    # `{`, small models copy the schema (`{"properties": {}, "type": "object"}`) into the call.
    arguments = '{"' if _takes_arguments(by_name[choice]) else "{}}"
    return f'{CALL_OPEN}\n{{"name": {json.dumps(choice, ensure_ascii=False)}, "arguments": {arguments}'


def forced_call_grammar(tools: Sequence[Mapping[str, Any]], name: str) -> Grammar:
    """A forced call of tool `name` as a grammar: the call's fixed opening, then arguments valid
    under the tool's parameter schema, then the brace that closes the call (for methods that
    honour constraints: nothing is left to get wrong, and no reply prefix is needed). The
    reply ends there, or after one line break: the closing tag is not written (templates make
    `</tool_call>` a special token, which spells no text), and the parser reads an unclosed last
    call as closed."""
    return Grammar(f"start: call0\n{_call_rules(tools, name, 'call0')}")


def auto_call_grammar(tools: Sequence[Mapping[str, Any]]) -> Grammar:
    """tool_choice "auto" as a grammar with both branches: a text reply, or a reply that is one
    well-formed call of one of `tools` (a known name, arguments valid under its schema; one
    call, as with `forced_call_grammar`). The text never opens a call itself (`<tool_call>`
    anywhere in it is refused), so every call is one the grammar wrote. A call after some text
    is not offered: llguidance's lexer ends a text lexeme greedily and cannot hand its tail to
    the call (docs/guides/constraints.md says so)."""
    names = [t["function"]["name"] for t in tools]
    calls = " | ".join(f"call{index}" for index in range(len(names)))
    rules = "\n".join(_call_rules(tools, name, f"call{index}") for index, name in enumerate(names))
    text = f"TEXT: /(?s:.+)/ & ~/(?s:.*{re.escape(CALL_OPEN)}.*)/"
    return Grammar(f"start: TEXT? | call\ncall: {calls}\n{rules}\n{text}")


def _call_rules(tools: Sequence[Mapping[str, Any]], name: str, rule: str) -> str:
    """Lark rules `rule` (one call of tool `name`) and `rule_arguments` (its arguments)."""
    parameters = dict(_function(tools, name).get("parameters") or {"type": "object"})
    if not parameters.get("properties"):
        parameters = {"type": "object", "properties": {}, "additionalProperties": False}
    opening = f'{CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
    # the line break templates put before the closing tag may follow (models write it with the brace)
    return f'{rule}: {json.dumps(opening)} {rule}_arguments "}}" "\\n"?\n{rule}_arguments: {json_rule(parameters)}'


def _function(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    return next(t["function"] for t in tools if t["function"]["name"] == name)


def _takes_arguments(function: Mapping[str, Any]) -> bool:
    return bool((function.get("parameters") or {}).get("properties"))


def resolve_tool_choice(choice: Any, names: Sequence[str], required: bool = False) -> str | None:
    """A framework's `tool_choice` as None (the model decides), "none", "any" or a tool name.

    Accepts None/"auto"/False, "none", "any"/"required"/True, a tool name, or
    `{"type": "function", "function": {"name": ...}}`; `required=True` (LlamaIndex's
    `tool_required`) turns "the model decides" into "any".

    Raises:
        ConfigError: a forced choice without tools, or a name that is not one of them.
    """
    if isinstance(choice, Mapping):
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    if choice is None or choice is False or choice == "auto":
        choice = "any" if required else None
    if choice is None or choice == "none":
        return choice
    if not names:
        raise ConfigError(f"`tool_choice` is {choice!r}, but no tools were given; pass the tools too.")
    if choice is True or choice in ("any", "required"):
        return "any"
    if choice in names:
        return choice
    raise ConfigError(
        f"`tool_choice` is {choice!r}, which is not one of the tools {list(names)} nor auto/none/any/required."
    )


@dataclass(frozen=True)
class ToolPlan:
    """How a call with tools is put to the ensemble.

    Attributes:
        tools: the tools to render (None: none offered, e.g. for tool_choice "none").
        reply_prefix: a forced call's opening ("" when the model decides, or when `constraint`
            writes the call).
        stop: the call's stop strings, plus `</tool_call>` when only one call is wanted.
        constraint: a forced call as a grammar (when the method honours constraints), or None.
    """

    tools: list[dict[str, Any]] | None
    reply_prefix: str
    stop: list[str]
    constraint: Grammar | None = None

    @property
    def tool_names(self) -> list[str] | None:
        return [t["function"]["name"] for t in self.tools] if self.tools else None


def plan_tools(
    tools: Sequence[Mapping[str, Any]] | None,
    choice: str | None,
    *,
    parallel_calls: bool,
    stop: Sequence[str],
    pick_tool: Callable[[list[dict[str, Any]]], str],
    constrain: bool = False,
) -> ToolPlan:
    """The `ToolPlan` for a resolved `choice` (see `resolve_tool_choice`).

    "any" of several tools is settled by `pick_tool` (the ensemble scores the names, see
    `Ensemble.pick_tool`) before the call is forced: a small model left to write the name may
    invent one. Without `parallel_calls` generation stops after the first call (the parser
    reads the unclosed call as closed). With `constrain` (the method honours constraints), a
    forced call is a grammar (`forced_call_grammar`) instead of a reply prefix, and "auto" is
    one too (`auto_call_grammar`: text, or one well-formed call).
    """
    offered = [dict(t) for t in tools] if tools and choice != "none" else None
    if offered and choice == "any":
        choice = pick_tool(offered) if len(offered) > 1 else offered[0]["function"]["name"]
    if constrain and offered and choice:
        return ToolPlan(offered, "", list(stop), forced_call_grammar(offered, choice))
    if constrain and offered:  # "auto": text, or a call that cannot break
        return ToolPlan(offered, "", list(stop), auto_call_grammar(offered))
    prefix = forced_call_prefix(offered, choice) if offered and choice else ""
    stops = [*stop, *([CALL_CLOSE] if offered and not parallel_calls else [])]
    if offered and choice and not _takes_arguments(_function(offered, choice)):
        # The prefix holds the whole call; all that may follow is its closing tag, which small
        # models misspell (`</tools>`): the first closing tag of any kind ends the reply.
        stops.append(CLOSING_TAG)
    return ToolPlan(offered, prefix, stops)
