"""Tool calls read from generated text: finished replies and streamed ones agree."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ensemble_core.chat.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    ToolCallStream,
    forced_call_prefix,
    parse_reply,
    plan_tools,
    resolve_tool_choice,
)
from ensemble_core.errors import ConfigError

TOOLS = ["get_weather", "add"]


def tagged(name: str, arguments: object) -> str:
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CALL_CLOSE}"


def test_hermes_blocks_are_calls_and_the_text_around_them_is_content() -> None:
    text = f"Let me check.\n{tagged('get_weather', {'city': 'Paris'})}\n{tagged('add', {'a': 1, 'b': 2})}"
    reply = parse_reply(text, TOOLS)
    assert reply.content == "Let me check."
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert len({c.id for c in reply.tool_calls}) == 2 and all(c.id.startswith("call_") for c in reply.tool_calls)
    assert reply.invalid_tool_calls == []


def test_an_unclosed_last_block_is_read_as_closed() -> None:
    reply = parse_reply(f'{CALL_OPEN}\n{{"name": "add", "arguments": {{"a": 1}}}}', TOOLS)
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("add", {"a": 1})]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add", "arguments": {"a": 1}}',
        '```json\n{"name": "add", "parameters": {"a": 1}}\n```',
        '[{"name": "add", "arguments": "{\\"a\\": 1}"}]',
        '{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
    ],
)
def test_bare_json_naming_an_offered_tool_is_a_call(text: str) -> None:
    reply = parse_reply(text, TOOLS)
    assert reply.content == ""
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("add", {"a": 1})]


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_json_that_names_no_offered_tool_is_plain_content(tools: list[str] | None) -> None:
    text = '{"name": "Ada", "age": 36}'
    assert parse_reply(text, tools).content == text
    assert parse_reply(text, tools).tool_calls == []


@pytest.mark.parametrize(
    ("body", "error", "name"),
    [
        ('{"name": "add", "arguments": {"a": 1', "not valid JSON", "add"),
        ('{"arguments": {}}', 'string "name"', None),
        ('{"name": "add", "arguments": 3}', "must be a JSON object", "add"),
        ('{"name": "delete_all", "arguments": {}}', "no tool named 'delete_all'", "delete_all"),
    ],
)
def test_badly_written_calls_are_reported_not_raised(body: str, error: str, name: str | None) -> None:
    reply = parse_reply(f"{CALL_OPEN}{body}{CALL_CLOSE}", TOOLS)
    assert reply.tool_calls == []
    [invalid] = reply.invalid_tool_calls
    assert error in invalid.error
    assert invalid.name == name
    assert invalid.text == body


def test_a_call_when_no_tools_were_offered_is_invalid() -> None:
    [invalid] = parse_reply(tagged("add", {}), None).invalid_tool_calls
    assert "no tools were offered" in invalid.error


def tool(name: str, *arguments: str) -> dict:
    properties = {a: {"type": "integer"} for a in arguments}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


def test_forced_prefixes_leave_only_the_arguments_or_the_name_to_write() -> None:
    one = forced_call_prefix([tool("add", "a")], "any")
    assert one.endswith('"arguments": {"')  # the first key's quote is written, so keys come quoted
    assert parse_reply(one + 'a": 1}}', ["add"]).tool_calls[0].arguments == {"a": 1}
    no_arguments = forced_call_prefix([tool("now")], "now")
    assert no_arguments.endswith('"arguments": {}}')  # nothing left to write: no schema copied into it
    assert parse_reply(no_arguments, ["now"]).tool_calls[0].arguments == {}
    assert parse_reply(no_arguments + "\n</tool_call>", ["now"]).tool_calls[0].arguments == {}
    several = forced_call_prefix([tool("get_weather"), tool("add", "a")], "any")
    assert parse_reply(several + 'get_weather", "arguments": {}}', TOOLS).tool_calls[0].name == "get_weather"


def streamed(text: str, cuts: list[int], tools: list[str] | None) -> tuple[str, list[tuple[str, dict]], int]:
    splitter = ToolCallStream(tools)
    events = []
    previous = 0
    for cut in [*sorted(set(cuts)), len(text)]:
        events += splitter.feed(text[previous:cut])
        previous = cut
    events += splitter.finish()
    content = "".join(e.text for e in events)
    return content, [(e.call.name, e.call.arguments) for e in events if e.call], sum(1 for e in events if e.invalid)


REPLIES = [
    "Plain answer with a < sign and <tool but no call.",
    f"Sure. {tagged('add', {'a': 1, 'b': 2})} Done.",
    tagged("get_weather", {"city": "Zürich"}) + tagged("add", {}),
    '{"name": "add", "arguments": {"a": 5}}',
    '{"name": "Ada"}',
    f"{CALL_OPEN}{{broken json{CALL_CLOSE} after",
    f"text then {CALL_OPEN}" + '{"name": "add", "arguments": {"a": 1}}',
]


@settings(max_examples=60, deadline=None)
@given(reply=st.sampled_from(REPLIES), cuts=st.lists(st.integers(0, 80), max_size=12), offered=st.booleans())
def test_streaming_releases_the_same_content_and_calls_as_parsing_the_whole(reply, cuts, offered) -> None:
    tools = TOOLS if offered else None
    whole = parse_reply(reply, tools)
    content, calls, invalid = streamed(reply, [c for c in cuts if c < len(reply)], tools)
    assert content.strip() == whole.content
    assert calls == [(c.name, c.arguments) for c in whole.tool_calls]
    assert invalid == len(whole.invalid_tool_calls)


def test_text_is_released_as_soon_as_it_cannot_start_a_call() -> None:
    splitter = ToolCallStream(TOOLS)
    assert [e.text for e in splitter.feed("Hello <tool")] == ["Hello "]
    assert splitter.feed("_c") == []
    assert [e.text for e in splitter.feed("x")] == ["<tool_cx"]


@pytest.mark.parametrize(
    ("choice", "required", "expected"),
    [
        (None, False, None),
        ("auto", False, None),
        (None, True, "any"),
        ("none", True, "none"),
        ("required", False, "any"),
        (True, False, "any"),
        ("add", False, "add"),
        ({"type": "function", "function": {"name": "add"}}, False, "add"),
    ],
)
def test_framework_tool_choices_resolve_to_one_vocabulary(choice, required: bool, expected: str | None) -> None:
    assert resolve_tool_choice(choice, TOOLS, required) == expected


@pytest.mark.parametrize(
    ("choice", "names", "message"), [("multiply", TOOLS, "not one of the tools"), ("any", [], "no tools")]
)
def test_impossible_tool_choices_are_config_errors(choice: str, names: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_tool_choice(choice, names)


def test_a_tool_plan_hides_forces_picks_and_stops() -> None:
    tools = [tool("get_weather", "city"), tool("add", "a")]
    picked: list[list[str]] = []

    def pick(offered: list[dict]) -> str:
        picked.append([t["function"]["name"] for t in offered])
        return "add"

    hidden = plan_tools(tools, "none", parallel_calls=True, stop=["x"], pick_tool=pick)
    assert (hidden.tools, hidden.reply_prefix, hidden.stop) == (None, "", ["x"])
    free = plan_tools(tools, None, parallel_calls=False, stop=[], pick_tool=pick)
    assert free.reply_prefix == "" and free.stop == [CALL_CLOSE] and free.tool_names == ["get_weather", "add"]
    forced = plan_tools(tools, "any", parallel_calls=True, stop=[], pick_tool=pick)
    assert picked == [["get_weather", "add"]]
    assert forced.reply_prefix == forced_call_prefix(tools, "add") and forced.stop == []
    # A tool without arguments: the prefix holds the whole call, so the first closing tag ends it
    # (Qwen + SmolLM2 once wrote `\n</tools>` after `{"name": ..., "arguments": {}}`).
    bare = plan_tools([tool("now")], "any", parallel_calls=True, stop=["x"], pick_tool=pick)
    assert bare.reply_prefix == forced_call_prefix([tool("now")], "now") and bare.stop == ["x", "</"]
    assert parse_reply(bare.reply_prefix + "\n", ["now"]).tool_calls[0].name == "now"
    assert picked == [["get_weather", "add"]]  # one tool offered: nothing to pick
