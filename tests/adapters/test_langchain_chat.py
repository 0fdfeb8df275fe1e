"""ChatEnsemble beyond the standard suites: construction, messages, streaming, tools, asyncio."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ValidationError

from ensemble_core import Ensemble, HFMember
from ensemble_core.loading import EnsembleSpec, shared_ensemble
from langchain_ensemble import ChatEnsemble
from langchain_ensemble.messages import to_core_messages

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
SAFE = {"models": MODELS, "method": "safe", "method_params": {"drafter": "qwen"}}


@pytest.fixture(scope="module")
def llm() -> ChatEnsemble:
    """The real pair, for what depends on what the models write (tool calls, stop strings in words)."""
    return ChatEnsemble(**SAFE, max_tokens=24)


@pytest.fixture(scope="module")
def tiny_llm(tiny_chat_ensemble: Ensemble) -> ChatEnsemble:
    """Tiny random-weight models (conftest's `tiny_chat_ensemble`), for the adapter's mechanics."""
    return ChatEnsemble(ensemble=tiny_chat_ensemble, max_tokens=24)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# ---------------------------------------------------------------------- construction


def test_construction_is_checked_but_loads_nothing() -> None:
    spec = EnsembleSpec.build(MODELS, "unite", {"top_k": 5})
    from ensemble_core import loading

    chat = ChatEnsemble(models=MODELS, method="unite", method_params={"top_k": 5})
    assert spec not in loading._loaded
    assert chat.model_name == "unite(qwen2.5-coder-0.5b-instruct+smollm2-135m-instruct)"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({**SAFE, "max_token": 5}, "max_token"),
        ({**SAFE, "max_tokens": 0}, "max_new_tokens"),
        ({**SAFE, "temperature": -1}, "temperature"),
        ({"models": MODELS, "method": "nope"}, "Unknown method 'nope'"),
        ({"models": MODELS, "method": "safe", "method_params": {"drafter": "qwen", "bogus": 1}}, "bogus"),
        ({"models": [*MODELS, "gemma-3-270m"], "method": "contrastive"}, "takes two members"),
        ({"models": MODELS, "method": "safe", "method_params": {"drafter": "gemma"}}, "`drafter` is 'gemma'"),
        ({"models": MODELS, "method": "gac", "method_params": {"threshold": 0.5, "primary": "x"}}, "`primary` is 'x'"),
        ({"models": []}, "non-empty list"),
        ({}, "exactly one of"),
        ({**SAFE, "timeout": 0}, "timeout"),
    ],
)
def test_bad_settings_are_errors_that_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ChatEnsemble(**kwargs)


def test_a_loaded_ensemble_is_shared_and_excludes_model_settings() -> None:
    ensemble = shared_ensemble(EnsembleSpec.build(**{k: SAFE[k] for k in ("models", "method", "method_params")}))
    first, second = ChatEnsemble(ensemble=ensemble), ChatEnsemble(ensemble=ensemble, temperature=0.5)
    assert first._get_ensemble() is second._get_ensemble() is ensemble
    assert ChatEnsemble(**SAFE)._get_ensemble() is ensemble  # same spec, same loaded ensemble
    with pytest.raises(ValidationError, match="apply to `models=`"):
        ChatEnsemble(ensemble=ensemble, method="gac")


def test_token_ids_come_from_the_reference_members_local_tokenizer(llm: ChatEnsemble) -> None:
    qwen = llm._get_ensemble().members[0]
    assert llm.get_token_ids("def add(a, b):") == qwen.tokenizer.encode("def add(a, b):", add_special_tokens=False)
    assert llm.get_num_tokens("def add(a, b):") == len(llm.get_token_ids("def add(a, b):"))


# ---------------------------------------------------------------------- messages


def test_every_message_kind_becomes_a_core_message() -> None:
    messages = [
        SystemMessage("Be brief."),
        HumanMessage([{"type": "text", "text": "What is"}, {"type": "text", "text": "1 + 2?"}], name="ada"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1", "type": "tool_call"}]),
        ToolMessage("3", tool_call_id="c1", name="add"),
        ToolMessage("b is missing", tool_call_id="c2", status="error"),
        ChatMessage(role="user", content="Thanks"),
    ]
    core = to_core_messages(messages)
    assert [m["role"] for m in core] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert core[1] == {"role": "user", "content": "What is\n1 + 2?", "name": "ada"}
    assert core[2]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    ]
    assert core[3]["tool_call_id"] == "c1" and core[4]["content"] == "Error: b is missing"


def test_an_image_in_a_message_is_an_error_before_any_generation(llm: ChatEnsemble) -> None:
    image = HumanMessage([{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(ValueError, match="read text only"):
        llm.invoke([image])
    from ensemble_core import loading

    unloaded = ChatEnsemble(models=MODELS, method="unite")
    with pytest.raises(ValueError, match="read text only"):
        unloaded.invoke([image])
    assert EnsembleSpec.build(MODELS, "unite") not in loading._loaded  # rejected before any model was loaded


# ---------------------------------------------------------------------- generation


def test_streaming_is_incremental_and_adds_up_to_invoke(tiny_llm: ChatEnsemble) -> None:
    llm = tiny_llm
    question = "List three colours, comma separated."
    chunks = list(llm.stream(question, max_tokens=24))
    whole = llm.invoke(question, max_tokens=24)
    assert len([c for c in chunks if c.content]) > 1
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.content == whole.content
    assert merged.usage_metadata == whole.usage_metadata  # input tokens counted once in the stream
    assert [c.usage_metadata is not None for c in chunks].count(True) == 1
    counted_by = {m.name: m for m in llm._get_ensemble().members}[whole.response_metadata["usage_counted_by"]]
    assert counted_by.name == "tiny-llama"  # SAFE's drafter counts the headline usage
    assert whole.usage_metadata["input_tokens"] == len(counted_by.render([{"role": "user", "content": question}]).ids)
    metadata = whole.response_metadata
    assert metadata["model_provider"] == "ensemble-llm" and metadata["finish_reason"] in ("stop", "length")
    assert set(metadata["ensemble"]["member_seconds"]) == {"tiny-qwen2", "tiny-llama"}
    assert 0.0 <= metadata["ensemble"]["share_ensembled"] <= 1.0


def test_call_stop_strings_add_to_the_instances(llm: ChatEnsemble) -> None:
    text = llm.invoke("Count from 1 to 10 with commas.", max_tokens=24).content
    assert "4" in text
    with_call_stop = llm.invoke("Count from 1 to 10 with commas.", max_tokens=24, stop=["4"]).content
    assert with_call_stop == text[: text.index("4")]
    stopping = llm.model_copy(update={"stop": ["3"]})
    both = stopping.invoke("Count from 1 to 10 with commas.", max_tokens=24, stop=["4"]).content
    assert both == text[: text.index("3")]


def test_unknown_call_options_are_errors(llm: ChatEnsemble) -> None:
    with pytest.raises(ValueError, match=r"unknown call options \['frequency_penalty'\]"):
        llm.invoke("Hi", frequency_penalty=0.5)
    with pytest.raises(ValueError, match="cannot switch to model='gpt-4o'"):
        llm.invoke("Hi", model="gpt-4o")


# ---------------------------------------------------------------------- tools


def test_a_forced_call_is_parsed_into_tool_calls_when_invoked_and_streamed(llm: ChatEnsemble) -> None:
    with_tools = llm.bind_tools([add], tool_choice="add")
    question = "What is 2 plus 40? Use the tool."
    message = with_tools.invoke(question)
    [call] = message.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"} and call["id"].startswith("call_")
    assert message.response_metadata["finish_reason"] == "tool_calls"
    streamed = None
    for chunk in with_tools.stream(question):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(call["name"], call["args"])]
    assert add.invoke(call) is not None


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny"


@pytest.mark.parametrize(("question", "expected"), [("Is it raining in Oslo?", "get_weather"), ("Add 3 and 4.", "add")])
def test_any_of_several_tools_is_picked_by_the_ensemble_not_invented(
    llm: ChatEnsemble, question: str, expected: str
) -> None:
    message = llm.bind_tools([add, get_weather], tool_choice="any").invoke(question)
    assert [c["name"] for c in message.tool_calls] == [expected]
    core = [{"role": "user", "content": question}]
    tools = [convert_to_openai_tool(add), convert_to_openai_tool(get_weather)]
    assert llm._get_ensemble().pick_tool(core, tools) == expected


def test_a_call_cut_short_is_an_invalid_tool_call_not_an_exception(llm: ChatEnsemble) -> None:
    message = llm.bind_tools([add], tool_choice="any").invoke("What is 2 plus 40?", max_tokens=2)
    assert message.tool_calls == []
    [invalid] = message.invalid_tool_calls
    assert invalid["name"] == "add" and "not valid JSON" in invalid["error"]


def test_tool_choice_is_checked_against_the_tools(llm: ChatEnsemble) -> None:
    with pytest.raises(ValueError, match="not one of the tools"):
        llm.bind_tools([add], tool_choice="multiply")


class Person(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_gives_the_schemas_type(llm: ChatEnsemble, method: str) -> None:
    structured = llm.with_structured_output(Person, method=method)
    person = structured.invoke("Ada Lovelace was 36 years old. Extract the person.", max_tokens=32)
    assert isinstance(person, Person)
    raw = llm.with_structured_output(Person, method=method, include_raw=True).invoke(
        "Ada Lovelace was 36 years old. Extract the person.", max_tokens=32
    )
    assert isinstance(raw["raw"], AIMessage) and raw["parsed"] == person and raw["parsing_error"] is None


def test_json_mode_replies_with_a_json_object(llm: ChatEnsemble) -> None:
    reply = llm.bind(response_format={"type": "json_object"}).invoke(
        "Give the capital of France as JSON with the key 'capital'.", max_tokens=24
    )
    assert isinstance(json.loads(reply.content), dict)


# ---------------------------------------------------------------------- asyncio


async def test_cancelling_an_async_stream_leaves_the_model_usable(tiny_llm: ChatEnsemble) -> None:
    llm = tiny_llm
    reference = (await llm.ainvoke("Tell me about the sea.", max_tokens=12)).content
    stream = llm.astream("Tell me a long story about the sea.", max_tokens=400)
    await anext(stream)
    await stream.aclose()
    assert (await llm.ainvoke("Tell me about the sea.", max_tokens=12)).content == reference


async def test_four_concurrent_ainvokes_with_different_stops_equal_sequential_calls(tiny_llm: ChatEnsemble) -> None:
    llm = tiny_llm
    question = "Write the English alphabet letters separated by spaces."
    full = llm.invoke(question, max_tokens=12).content
    stops = [full[i : i + 2] for i in range(2, 2 + 4 * 2, 2)]
    sequential = [llm.invoke(question, max_tokens=12, stop=[s]).content for s in stops]
    concurrent = await asyncio.gather(*(llm.ainvoke(question, max_tokens=12, stop=[s]) for s in stops))
    assert [m.content for m in concurrent] == sequential
    assert len(set(sequential)) > 1


def test_a_timeout_stops_generation_with_an_error_and_the_model_stays_usable(tiny_llm: ChatEnsemble) -> None:
    llm = tiny_llm
    hasty = llm.model_copy(update={"timeout": 0.3})
    with pytest.raises(TimeoutError, match=r"timeout=0.3"):
        hasty.invoke("Write a long story about the sea.", max_tokens=400)
    assert llm.invoke("Say hi.", max_tokens=4).content


def test_batch_serves_every_prompt_like_invoke(tiny_llm: ChatEnsemble) -> None:
    llm = tiny_llm
    prompts = ["Say hi.", "Say bye.", "Name a fruit."]
    assert [m.content for m in llm.batch(prompts, max_tokens=8)] == [
        llm.invoke(p, max_tokens=8).content for p in prompts
    ]


def test_a_member_list_can_also_be_given_as_loaded_members() -> None:
    ensemble = Ensemble([HFMember.from_pretrained("smollm2-135m-instruct")], method="single")
    chat = ChatEnsemble(ensemble=ensemble, max_tokens=6)
    assert chat.model_name == "single(smollm2-135m-instruct)"
    assert chat.invoke("Hi").response_metadata["ensemble"]["method"] == "single"
