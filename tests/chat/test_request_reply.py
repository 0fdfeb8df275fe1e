"""The one request/reply path the adapters share (`chat.request`, `chat.reply`), without any model."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ensemble_core.chat.reply import (
    InvalidToolCallEvent,
    ReplyAssembler,
    TextDelta,
    ToolCallEvent,
    read_reply,
)
from ensemble_core.chat.request import ChatRequest, build_request, json_reply
from ensemble_core.chat.tool_calls import CALL_CLOSE, forced_call_prefix, parse_reply
from ensemble_core.constraints import Grammar, JSONObject, JSONSchema
from ensemble_core.errors import ConfigError, GenerationError
from ensemble_core.results import GenerationResult, GenerationStats, MemberUsage, MethodStats, StreamChunk, Usage


def tool(name: str, **properties: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


MULTIPLY = tool("multiply", a="integer", b="integer")
WEATHER = tool("weather", city="string")
USER = [{"role": "user", "content": "6 x 7?"}]
DEFAULTS = {"max_new_tokens": 16, "stop": ["\n\n"], "temperature": 0.0, "top_p": 1.0, "seed": None}


class Picker:
    """A `pick_tool` that records its calls."""

    def __init__(self, name: str = "weather"):
        self.name = name
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, prompt: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        self.calls.append((prompt, tools))
        return self.name


def request(options: dict[str, Any], picker: Picker | None = None, **kwargs: Any) -> ChatRequest:
    return build_request(
        USER, DEFAULTS, options, pick_tool=picker or Picker(), served="single(m)", caller="Front", **kwargs
    )


# ---------------------------------------------------------------------- build_request


def test_settings_replace_the_defaults_and_stops_add_up() -> None:
    built = request({"max_new_tokens": 5, "stop": "END", "seed": 3})
    assert built.prompt == USER and built.tools is None and built.reply_prefix == ""
    assert built.settings == {**DEFAULTS, "max_new_tokens": 5, "stop": ["\n\n", "END"], "seed": 3}
    assert built.core_arguments == {"tools": None, "reply_prefix": "", **built.settings}
    assert request({"stop": None}).settings["stop"] == ["\n\n"]


def test_a_front_end_may_rename_an_option_and_then_only_its_name_is_known() -> None:
    assert request({"max_tokens": 4}, renamed={"max_tokens": "max_new_tokens"}).settings["max_new_tokens"] == 4
    with pytest.raises(ConfigError, match=r"Front got unknown call options \['max_new_tokens'\]; known: .*max_tokens"):
        request({"max_new_tokens": 4}, renamed={"max_tokens": "max_new_tokens"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"frequency_penalty": 0.5}, r"unknown call options \['frequency_penalty'\]; known: "),
        ({"temperature": -1}, "`temperature` has to be"),
        ({"top_p": 2.0}, r"`top_p` has to be in \(0, 1\]"),
        ({"stop": 5}, "`stop` has to be a string or a list of strings"),
        ({"stop": [""]}, "`stop` must hold non-empty strings"),
        ({"model": "gpt-4o"}, "Front serves 'single\\(m\\)' and cannot switch to model='gpt-4o'"),
        ({"tools": ["add"]}, r"`tools\[0\]` must look like"),
        ({"tools": [MULTIPLY], "tool_choice": "divide"}, "`tool_choice` is 'divide', which is not one of the tools"),
        ({"tools": None, "tool_choice": "required"}, "`tool_choice` is 'required', but no tools were given"),
        ({"parallel_tool_calls": "yes"}, "`parallel_tool_calls` has to be True, False or None"),
        ({"response_format": {"type": "xml"}}, "`response_format` has to be"),
        ({"response_format": "json"}, "`response_format` has to be"),
    ],
)
def test_every_bad_option_is_a_config_error_naming_it_before_any_model_work(
    options: dict[str, Any], message: str
) -> None:
    picker = Picker()
    with pytest.raises(ConfigError, match=message):
        request({"tools": [MULTIPLY, WEATHER], "tool_choice": "any", **options}, picker)
    assert picker.calls == []  # a tool is picked (by the models) only once everything else is right


def test_the_served_model_name_is_accepted() -> None:
    assert request({"model": "single(m)"}).settings == DEFAULTS


def test_any_of_several_tools_is_picked_then_forced() -> None:
    picker = Picker("weather")
    built = request({"tools": [MULTIPLY, WEATHER], "tool_choice": "required", "parallel_tool_calls": False}, picker)
    assert picker.calls == [(USER, [MULTIPLY, WEATHER])]
    assert built.reply_prefix == forced_call_prefix([WEATHER], "weather")
    assert built.settings["stop"] == ["\n\n", CALL_CLOSE]
    assert built.tool_names == ["multiply", "weather"]


def test_tool_choice_none_hides_the_tools_and_parallel_calls_stop_nothing() -> None:
    assert request({"tools": [MULTIPLY], "tool_choice": "none"}).tools is None
    built = request(
        {"tools": [MULTIPLY], "parallel_tool_calls": None, "tool_choice": {"function": {"name": "multiply"}}}
    )
    assert built.settings["stop"] == ["\n\n"] and built.reply_prefix.endswith('"arguments": {"')


def test_json_mode_adds_a_note_and_opens_the_object_without_changing_the_callers_messages() -> None:
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    built = build_request(
        messages,
        DEFAULTS,
        {"response_format": {"type": "json_object"}},
        pick_tool=Picker(),
        served="m",
        caller="Front",
    )
    assert built.reply_prefix == "{"
    assert built.prompt[0]["content"].startswith("Be brief.\n\nReply with one JSON object")
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert request({"response_format": {"type": "text"}}).prompt == USER


def test_a_json_schema_is_described_by_its_keys_and_opened_at_the_first() -> None:
    schema = {
        "properties": {"name": {"type": "string", "description": "full name"}, "age": {"type": "integer"}},
        "required": ["name"],
    }
    note, opening = json_reply({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert '- "name": string: full name' in note and '- "age": integer (optional)' in note
    assert opening == '{"name": "'
    assert json_reply({"type": "json_schema", "schema": {"type": "object"}})[1] == "{"


def test_a_forced_call_wins_over_the_json_opening() -> None:
    built = request({"tools": [MULTIPLY], "tool_choice": "multiply", "response_format": {"type": "json_object"}})
    assert built.reply_prefix == forced_call_prefix([MULTIPLY], "multiply")


def test_with_a_method_that_constrains_json_and_forced_calls_become_grammars() -> None:
    from llguidance import LLMatcher

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def constrained(options: dict[str, Any]) -> ChatRequest:
        return build_request(USER, DEFAULTS, options, pick_tool=Picker(), served="m", caller="Front", constrains=True)

    as_object = constrained({"response_format": {"type": "json_object"}})
    assert as_object.reply_prefix == "" and isinstance(as_object.constraint, JSONObject)
    assert as_object.prompt[0]["content"].startswith("Reply with one JSON object")  # still asked for
    as_schema = constrained({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert as_schema.constraint == JSONSchema(schema) and as_schema.core_arguments["constraint"] is as_schema.constraint
    call = constrained({"tools": [MULTIPLY, WEATHER], "tool_choice": "required"})  # the picker settles "weather"
    assert call.reply_prefix == "" and isinstance(call.constraint, Grammar)
    opening = '<tool_call>\n{"name": "weather", "arguments": '
    for text, whole in (('{"city": "Lyon"}}', True), ('{"city": 7}}', False), ('{"city": "Lyon"}', False)):
        accepted = ConstraintCheck(call.constraint).accepts(opening + text)
        assert accepted == whole, text
    assert LLMatcher.validate_grammar(call.constraint.grammar()) == ""
    # a method that cannot constrain: asked for in the prompt, the reply opened for the members
    assert request({"response_format": {"type": "json_object"}}).constraint is None
    asked = []
    constrained_later = build_request(
        USER,
        DEFAULTS,
        {"response_format": {"type": "json_object"}},
        pick_tool=Picker(),
        served="m",
        caller="Front",
        constrains=lambda: asked.append(1) or True,
    )
    assert asked == [1] and isinstance(constrained_later.constraint, JSONObject)
    with pytest.raises(ConfigError, match="Unimplemented keys"):  # before any model is asked
        constrained({"response_format": {"type": "json_schema", "schema": {"not": {"type": "string"}}}})


def test_auto_tool_choice_is_text_or_one_well_formed_call_with_a_method_that_constrains() -> None:
    def constrained(options: dict[str, Any]) -> ChatRequest:
        return build_request(USER, DEFAULTS, options, pick_tool=Picker(), served="m", caller="Front", constrains=True)

    auto = constrained({"tools": [MULTIPLY, WEATHER]})
    assert auto.reply_prefix == "" and isinstance(auto.constraint, Grammar)
    check = ConstraintCheck(auto.constraint)
    weather = '<tool_call>\n{"name": "weather", "arguments": {"city": "Lyon"}}'
    multiply = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n'
    for text in ("", "It is sunny in Lyon.", "<b>bold</b> <tool", weather, multiply):
        assert check.accepts(text), text
    refused = (
        '<tool_call>\n{"name": "divide", "arguments": {}}',  # no such tool
        '<tool_call>\n{"name": "weather", "arguments": {"city": 7}}',  # arguments off its schema
        weather + "\nand more text",  # one call, and it ends the reply
        "text that opens <tool_call> itself",
        "Let me look. " + weather,  # a call is the whole reply (docs/guides/constraints.md)
    )
    for text in refused:
        assert not check.accepts(text), text
    # a JSON reply wins over "auto"; without tools, or with "none", there is no call to shape
    assert isinstance(
        constrained({"tools": [MULTIPLY], "response_format": {"type": "json_object"}}).constraint, JSONObject
    )
    assert constrained({"tools": [MULTIPLY], "tool_choice": "none"}).constraint is None
    assert request({"tools": [MULTIPLY]}).constraint is None  # a method that cannot constrain: as before


class ConstraintCheck:
    """Whole texts against a constraint, through llguidance over single bytes."""

    def __init__(self, constraint: Any) -> None:
        from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

        class Bytes:
            eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
            tokens = [bytes([b]) for b in range(256)] + [b""]

            def __call__(self, text: Any) -> list[int]:
                return list(text if isinstance(text, bytes) else text.encode())

        self.matcher = LLMatcher(LLTokenizer(TokenizerWrapper(Bytes())), constraint.grammar(), log_level=0)

    def accepts(self, text: str) -> bool:
        data = list(text.encode())
        return self.matcher.validate_tokens(data) == len(data) and _complete(self.matcher, data)


def _complete(matcher: Any, data: list[int]) -> bool:
    copy = matcher.deep_copy()
    copy.consume_tokens(data)
    return copy.is_accepting()


# ---------------------------------------------------------------------- the reply


def result(text: str, finish_reason: str = "eos") -> GenerationResult:
    usage = Usage(7, 3, "m", {"m": MemberUsage(8, 3)})
    return GenerationResult(text, finish_reason, usage, GenerationStats("single", 3, 0.5, {}, MethodStats()))  # type: ignore[arg-type]


def chunks(pieces: list[str], finish_reason: str = "eos") -> list[StreamChunk]:
    last = StreamChunk(pieces[-1], finish_reason=finish_reason, result=result("".join(pieces), finish_reason))  # type: ignore[arg-type]
    return [*(StreamChunk(piece) for piece in pieces[:-1]), last]


TOOLS = ChatRequest(USER, {}, [MULTIPLY])
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


def test_text_is_released_as_it_comes_and_a_call_once_whole() -> None:
    assembler = ReplyAssembler(TOOLS)
    pieces = ["Let me ", "compute. <tool_", CALL.removeprefix("<tool_")[:20], CALL.removeprefix("<tool_")[20:], " ok"]
    events = [assembler.feed(chunk) for chunk in chunks(pieces)]
    assert events[0] == [TextDelta("Let me ")]
    assert events[1] == [TextDelta("compute. ")]  # "<tool_" could open a call: held back
    assert events[2] == []
    [call_event] = events[3]
    assert isinstance(call_event, ToolCallEvent) and call_event.index == 0
    assert (call_event.call.name, call_event.call.arguments) == ("multiply", {"a": 6, "b": 7})
    assert events[4] == [TextDelta(" ok")]
    reply = assembler.reply
    assert reply is not None and assembler.text == "Let me compute.  ok"
    assert reply.content == "Let me compute.  ok".strip()
    assert reply.tool_calls == (call_event.call,)  # the very call the event carried, id included
    assert (reply.finish_reason, reply.usage.total_tokens, reply.summary()["method"]) == ("tool_calls", 10, "single")
    with pytest.raises(GenerationError, match="already ended"):
        assembler.feed(StreamChunk("more"))


def test_an_invalid_call_is_an_event_not_an_exception() -> None:
    assembler = ReplyAssembler(TOOLS)
    [events] = [assembler.feed(chunk) for chunk in chunks(['<tool_call>{"name": "divide", "arguments": {}}'])]
    [event] = events
    assert isinstance(event, InvalidToolCallEvent) and "no tool named 'divide'" in event.call.error
    assert assembler.reply is not None and assembler.reply.finish_reason == "stop"


def test_a_forced_opening_is_read_as_the_start_of_the_reply() -> None:
    forced = ChatRequest(USER, {}, [MULTIPLY], forced_call_prefix([MULTIPLY], "multiply"))
    reply = read_reply(forced, result('a": 6, "b": 7}}\n', "stop"))
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    assert reply.content == "" and reply.finish_reason == "tool_calls"
    assert read_reply(ChatRequest(USER, {}, None, "{"), result('"a": 1}', "length")).content == '{"a": 1}'
    assert read_reply(ChatRequest(USER, {}, None, "{"), result('"a": 1}', "length")).finish_reason == "length"


REPLIES = [
    "Hello there.",
    "  Spaces around  ",
    f"Let me compute.\n{CALL}\nDone.",
    f"{CALL}{CALL}",
    CALL.removesuffix("</tool_call>"),
    '{"name": "multiply", "arguments": {"a": 2, "b": 3}}',
    '```json\n[{"name": "multiply", "arguments": {"a": 2}}, {"name": "multiply", "parameters": {"b": 1}}]\n```',
    '{"answer": 42}',
    '{"name": "multiply", "arguments": "not json"}',
    '{"a": 1} and then ' + CALL,
    "<tool_call>{broken json</tool_call> after",
    "a < b <tool",
    "`x` is a variable",
]


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("tools", [[MULTIPLY], None])
def test_streamed_and_whole_replies_mean_what_parse_reply_reads(text: str, tools: list[dict[str, Any]] | None) -> None:
    built = ChatRequest(USER, {}, tools)
    parsed = parse_reply(text, built.tool_names)
    whole = read_reply(built, result(text))

    def shape(reply: Any) -> tuple[Any, ...]:
        return (
            reply.content,
            [(c.name, c.arguments) for c in reply.tool_calls],
            [(c.text, c.error) for c in reply.invalid_tool_calls],
        )

    assert shape(whole) == shape(parsed)
    for cut in itertools.combinations(range(1, len(text)), 2):  # every three-piece stream of the text
        pieces = [text[: cut[0]], text[cut[0] : cut[1]], text[cut[1] :]]
        assembler = ReplyAssembler(built)
        events = [event for chunk in chunks(pieces) for event in assembler.feed(chunk)]
        assert assembler.reply is not None and shape(assembler.reply) == shape(parsed), pieces
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == assembler.text
        assert [e.call for e in events if isinstance(e, ToolCallEvent)] == list(assembler.reply.tool_calls)
