"""`EnsembleLLM` on its own: construction, metadata, message conversion, tool calls, streaming,
and the context-window error.

Most tests drive the adapter with a scripted ensemble (its replies are fixed text), so what is
checked is the adapter's own work: what it hands the core and how it reads the reply. The
context-window tests run a real `Ensemble` of tiny random-weight members (512-token windows).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.tools import FunctionTool
from pydantic import ValidationError

from ensemble_core import Ensemble, GenerationResult, GenerationStats, HFMember, MemberUsage, StreamChunk, Usage
from ensemble_core.chat.tool_calls import CALL_CLOSE, forced_call_prefix
from ensemble_core.errors import ConfigError
from ensemble_core.results import MethodStats
from llamaindex_ensemble import EnsembleLLM
from llamaindex_ensemble.messages import to_core_messages

PACKAGED = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


MULTIPLY = FunctionTool.from_defaults(multiply)


@dataclass
class ScriptedStats(MethodStats):
    """A method's figures, as a scripted reply reports them."""

    @property
    def share_ensembled(self) -> float | None:
        return 0.25


class ScriptedEnsemble(Ensemble):
    """An ensemble whose reply is fixed text in fixed pieces; it records what it was asked."""

    def __init__(self, member: HFMember):
        super().__init__([member], method="single")
        self.pieces: list[str] = ["Hello", " there."]
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def generate(self, prompt: Any, **arguments: Any) -> GenerationResult:  # type: ignore[override]
        self.calls.append((prompt, arguments))
        return self._result()

    def stream(self, prompt: Any, *, cancel: Any = None, **arguments: Any) -> Iterator[StreamChunk]:  # type: ignore[override]
        self.calls.append((prompt, arguments))
        return self._chunks()

    def _chunks(self) -> Iterator[StreamChunk]:
        for piece in self.pieces[:-1]:
            yield StreamChunk(piece)
        yield StreamChunk(self.pieces[-1], finish_reason="eos", result=self._result())

    def _result(self) -> GenerationResult:
        usage = Usage(7, 3, "scripted", {"scripted": MemberUsage(8, 3)})
        stats = GenerationStats("single", 3, 0.5, {}, ScriptedStats())
        return GenerationResult("".join(self.pieces), "eos", usage, stats)


@pytest.fixture
def scripted(tiny_member: Callable[[str], HFMember]) -> ScriptedEnsemble:
    return ScriptedEnsemble(tiny_member("tiny-qwen2"))


@pytest.fixture
def llm(scripted: ScriptedEnsemble) -> EnsembleLLM:
    return EnsembleLLM(ensemble=scripted, max_new_tokens=16, stop=["\n\n"])


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, content=text)]


# ---------------------------------------------------------------------- construction and metadata


def test_construction_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_loading(spec: Any) -> None:
        raise AssertionError("models were loaded")

    monkeypatch.setattr("llamaindex_ensemble.llm.shared_ensemble", no_loading)
    llm = EnsembleLLM(models=PACKAGED, method="safe", method_params={"drafter": "qwen"}, context_window=2048)
    assert llm.model_name == f"safe({PACKAGED[0]}+{PACKAGED[1]})"
    metadata = llm.metadata  # a given context_window needs no loading
    assert (metadata.context_window, metadata.num_output) == (2048, 256)
    assert metadata.is_chat_model and metadata.is_function_calling_model
    assert metadata.model_name == llm.model_name
    unset = EnsembleLLM(models=PACKAGED)  # the window comes from the models' configs, not from loading them
    assert unset.metadata.context_window == unset.to_payload()["context_window"] == 8192


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "exactly one of `models=[...]`"),
        ({"ensemble": "x"}, "Input should be an instance of Ensemble"),
        ({"models": PACKAGED, "method": "nonsense"}, "nonsense"),
        ({"models": []}, "non-empty list of model names"),
        ({"models": PACKAGED, "temperature": -1.0}, "`temperature` has to be"),
        ({"models": PACKAGED, "max_new_tokens": 0}, "`max_new_tokens` has to be a positive integer"),
        ({"models": PACKAGED, "context_window": 0}, "`context_window` has to be a positive number"),
        ({"models": PACKAGED, "context_window": 10**6}, "smallest member window of"),  # read from configs
        ({"models": PACKAGED, "max_tokens": 10}, "max_tokens"),
    ],
)
def test_bad_construction_names_the_problem(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        EnsembleLLM(**arguments)


def test_ensemble_and_models_or_method_do_not_mix(scripted: ScriptedEnsemble) -> None:
    with pytest.raises(ValidationError, match="exactly one of"):
        EnsembleLLM(ensemble=scripted, models=PACKAGED)
    with pytest.raises(ValidationError, match="already has its members and method"):
        EnsembleLLM(ensemble=scripted, method="safe")


def test_metadata_reports_the_smallest_member_window(
    tiny_member: Callable[[str], HFMember], monkeypatch: pytest.MonkeyPatch
) -> None:
    members = [tiny_member("tiny-qwen2"), tiny_member("tiny-llama")]
    monkeypatch.setattr(members[1], "context_window", 300)
    ensemble = Ensemble(members, method="gac")
    metadata = EnsembleLLM(ensemble=ensemble, max_new_tokens=20).metadata
    assert (metadata.context_window, metadata.num_output) == (300, 20)
    assert metadata.model_name == ensemble.model_name
    assert EnsembleLLM(ensemble=ensemble, context_window=200).metadata.context_window == 200
    with pytest.raises(ValidationError, match=r"`context_window` is 400 tokens, .* smallest member window .* is 300"):
        EnsembleLLM(ensemble=ensemble, context_window=400)  # at construction, not at the first call


# ---------------------------------------------------------------------- the prompt the core gets


def test_history_becomes_core_messages_with_tool_calls_and_results() -> None:
    history = [
        ChatMessage(role=MessageRole.SYSTEM, content="Be brief."),
        ChatMessage(role=MessageRole.DEVELOPER, content="Use tools."),
        ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="What is"), TextBlock(text="6 x 7?")]),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[
                ThinkingBlock(content="hidden reasoning"),
                ToolCallBlock(tool_call_id="c1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7}),
                ToolCallBlock(tool_call_id="c2", tool_name="multiply", tool_kwargs='{"a": 1, "b": 2}'),
            ],
        ),
        ChatMessage(role=MessageRole.TOOL, content="42", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="",
            additional_kwargs={
                "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "add", "arguments": '{"x": 1}'}}]
            },
        ),
    ]
    core = to_core_messages(history)
    assert [m["role"] for m in core] == ["system", "system", "user", "assistant", "tool", "assistant"]
    assert core[2]["content"] == "What is\n6 x 7?"
    assert core[3]["content"] == ""  # the reasoning is not sent back
    assert [c["function"] for c in core[3]["tool_calls"]] == [
        {"name": "multiply", "arguments": {"a": 6, "b": 7}},
        {"name": "multiply", "arguments": {"a": 1, "b": 2}},
    ]
    assert [c["id"] for c in core[3]["tool_calls"]] == ["c1", "c2"]
    assert core[4] == {"role": "tool", "content": "42", "tool_call_id": "c1"}
    assert core[5]["tool_calls"] == [
        {"id": "c3", "type": "function", "function": {"name": "add", "arguments": {"x": 1}}}
    ]


def test_a_non_text_block_is_an_error_naming_the_message(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    message = ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="Look:"), ImageBlock(url="http://x/y.png")])
    with pytest.raises(ConfigError, match=r"`messages\[1\]` content part 1 is of type 'image'"):
        llm.chat([ChatMessage(role=MessageRole.SYSTEM, content="Hi"), message])
    assert scripted.calls == []  # rejected before the core was asked


def test_chat_passes_messages_and_settings_to_the_core(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    response = llm.chat(user("Hi"), max_new_tokens=5, stop=["END"], seed=3)
    prompt, arguments = scripted.calls[-1]
    assert prompt == [{"role": "user", "content": "Hi"}]
    assert arguments == {
        "tools": None,
        "reply_prefix": "",
        "max_new_tokens": 5,
        "stop": ["\n\n", "END"],  # the field's stops, then the call's
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 3,
    }
    assert response.message.role == MessageRole.ASSISTANT
    assert response.message.content == "Hello there."
    assert response.additional_kwargs == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert response.raw["finish_reason"] == "stop"
    assert response.raw["usage"]["members"] == {"scripted": {"prompt_tokens": 8, "completion_tokens": 3}}
    assert response.raw["ensemble"]["share_ensembled"] == 0.25


def test_unknown_call_options_and_bad_settings_are_errors(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    with pytest.raises(ConfigError, match=r"unknown call options \['max_tokens'\]"):
        llm.chat(user("Hi"), max_tokens=5)
    with pytest.raises(ConfigError, match="`top_p` has to be in"):
        llm.complete("Hi", top_p=2.0)
    assert scripted.calls == []


def test_complete_sends_the_prompt_as_one_user_message(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    response = llm.complete("Say hi.", formatted=True)
    assert scripted.calls[-1][0] == [{"role": "user", "content": "Say hi."}]
    assert response.text == "Hello there."
    assert response.raw["usage"]["total_tokens"] == 10
    streamed = list(llm.stream_complete("Say hi."))
    assert [(r.delta, r.text) for r in streamed] == [("Hello", "Hello"), (" there.", "Hello there.")]
    assert streamed[-1].raw["ensemble"]["steps"] == 3


# ---------------------------------------------------------------------- tool calls


def test_a_tool_call_in_the_reply_becomes_a_tool_selection(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    scripted.pieces = ["Let me compute.\n", CALL]
    response = llm.chat_with_tools([MULTIPLY], user_msg="What is 6 times 7?", allow_parallel_tool_calls=True)
    prompt, arguments = scripted.calls[-1]
    assert prompt == [{"role": "user", "content": "What is 6 times 7?"}]
    assert arguments["tools"] == [MULTIPLY.metadata.to_openai_tool()]
    assert arguments["reply_prefix"] == "" and arguments["stop"] == ["\n\n"]
    assert response.message.content == "Let me compute."
    (selection,) = llm.get_tool_calls_from_response(response)
    assert (selection.tool_name, selection.tool_kwargs) == ("multiply", {"a": 6, "b": 7})
    assert selection.tool_id.startswith("call_")
    assert response.raw["finish_reason"] == "tool_calls"


def test_a_bare_json_call_is_read_too(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    scripted.pieces = ['{"name": "multiply", "arguments": {"a": 2, "b": 3}}']
    response = llm.chat_with_tools([MULTIPLY], user_msg="2 times 3?")
    assert [s.tool_kwargs for s in llm.get_tool_calls_from_response(response)] == [{"a": 2, "b": 3}]


def test_forcing_a_call_is_a_grammar_for_methods_that_constrain(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    scripted.pieces = ['{"name": "multiply", "arguments": {"a":6,"b":7}}']
    response = llm.chat_with_tools([MULTIPLY], user_msg="6 x 7?", tool_choice="multiply")
    arguments = scripted.calls[-1][1]
    assert arguments["constraint"] is not None and not arguments.get("reply_prefix")
    (selection,) = llm.get_tool_calls_from_response(response)
    assert (selection.tool_name, selection.tool_kwargs) == ("multiply", {"a": 6, "b": 7})


def test_forcing_a_call_starts_the_reply_with_its_opening(
    llm: EnsembleLLM, scripted: ScriptedEnsemble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method that cannot constrain (SweetSpan, SpecFuse) is made to call by its reply's start."""
    monkeypatch.setattr(ScriptedEnsemble, "constrains", property(lambda self: False))
    scripted.pieces = ['a": 6, "b": 7}}\n']  # the members write only the arguments
    for forcing in ({"tool_required": True}, {"tool_choice": "multiply"}, {"tool_choice": "required"}):
        response = llm.chat_with_tools([MULTIPLY], user_msg="6 x 7?", **forcing)
        arguments = scripted.calls[-1][1]
        assert arguments["reply_prefix"] == forced_call_prefix(arguments["tools"], "multiply")
        assert arguments["reply_prefix"].endswith('"arguments": {"')
        assert arguments["stop"] == ["\n\n", CALL_CLOSE]  # one call only: parallel calls were not allowed
        (selection,) = llm.get_tool_calls_from_response(response)
        assert (selection.tool_name, selection.tool_kwargs) == ("multiply", {"a": 6, "b": 7})


def test_tool_choice_none_hides_the_tools_and_bad_choices_fail(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    llm.chat_with_tools([MULTIPLY], user_msg="Hi", tool_choice="none")
    assert scripted.calls[-1][1]["tools"] is None
    with pytest.raises(ConfigError, match="'divide', which is not one of the tools"):
        llm.chat_with_tools([MULTIPLY], user_msg="Hi", tool_choice="divide")
    with pytest.raises(ConfigError, match="no tools were given"):
        llm.chat(user("Hi"), tool_choice="required")


def test_only_the_first_call_is_kept_unless_parallel_calls_are_allowed(
    llm: EnsembleLLM, scripted: ScriptedEnsemble
) -> None:
    second = CALL.replace('"a": 6', '"a": 5')
    scripted.pieces = [CALL, second]
    single = llm.chat_with_tools([MULTIPLY], user_msg="Hi", allow_parallel_tool_calls=False)
    both = llm.chat_with_tools([MULTIPLY], user_msg="Hi", allow_parallel_tool_calls=True)
    assert [s.tool_kwargs["a"] for s in llm.get_tool_calls_from_response(single)] == [6]
    assert [s.tool_kwargs["a"] for s in llm.get_tool_calls_from_response(both)] == [6, 5]


def test_no_call_or_an_invalid_call_explains_itself(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    scripted.pieces = ["I'd rather not."]
    response = llm.chat_with_tools([MULTIPLY], user_msg="Hi")
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match=r"answered in text: \"I'd rather not\.\".* tool_required=True"):
        llm.get_tool_calls_from_response(response)

    scripted.pieces = ['<tool_call>\n{"name": "divide", "arguments": {"a": 1}}\n</tool_call>']
    response = llm.chat_with_tools([MULTIPLY], user_msg="Hi")
    (invalid,) = response.message.additional_kwargs["invalid_tool_calls"]
    assert invalid["name"] == "divide" and "there is no tool named 'divide'" in invalid["error"]
    with pytest.raises(ValueError, match=r"only invalid ones: .*there is no tool named 'divide'"):
        llm.get_tool_calls_from_response(response)


def test_the_caller_history_is_not_changed(llm: EnsembleLLM) -> None:
    history = user("Earlier question")
    arguments = llm._prepare_chat_with_tools([MULTIPLY], user_msg="Now", chat_history=history)
    assert [m.content for m in arguments["messages"]] == ["Earlier question", "Now"]
    assert len(history) == 1


# ---------------------------------------------------------------------- streaming


STREAMED = ["Let me ", "compute. <tool_", 'call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>']


def _check_streamed(responses: list[Any]) -> None:
    deltas = [r.delta for r in responses]
    assert deltas == ["Let me ", "compute. ", ""]  # "<tool_" is held back: it could start a call
    assert [r.message.content for r in responses] == ["Let me ", "Let me compute. ", "Let me compute. "]
    blocks = [b for b in responses[-1].message.blocks if isinstance(b, ToolCallBlock)]
    assert [(b.tool_name, b.tool_kwargs) for b in blocks] == [("multiply", {"a": 6, "b": 7})]
    assert all(r.raw is None for r in responses[:-1])
    assert responses[-1].raw["finish_reason"] == "tool_calls"
    assert responses[-1].additional_kwargs["total_tokens"] == 10


def test_stream_chat_gives_text_as_it_comes_and_calls_when_whole(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    scripted.pieces = STREAMED
    responses = list(llm.stream_chat(user("6 x 7?"), tools=[MULTIPLY]))
    _check_streamed(responses)
    (selection,) = llm.get_tool_calls_from_response(responses[-1])
    assert selection.tool_kwargs == {"a": 6, "b": 7}


async def test_astream_chat_gives_the_same_responses(llm: EnsembleLLM, scripted: ScriptedEnsemble) -> None:
    scripted.pieces = STREAMED
    _check_streamed([r async for r in await llm.astream_chat(user("6 x 7?"), tools=[MULTIPLY])])
    scripted.pieces = ["Hello", " there."]
    completion = await llm.acomplete("Hi")
    streamed = [r async for r in await llm.astream_complete("Hi")]
    assert completion.text == streamed[-1].text == (await llm.achat(user("Hi"))).message.content == "Hello there."


# ---------------------------------------------------------------------- the context window


@pytest.fixture
def tiny_llm(tiny_member: Callable[[str], HFMember]) -> EnsembleLLM:
    ensemble = Ensemble([tiny_member("tiny-qwen2"), tiny_member("tiny-llama")], method="gac")
    return EnsembleLLM(ensemble=ensemble, max_new_tokens=4)


TOO_LONG = "alpha beta gamma delta " * 200  # ~800 tokens; the tiny members hold 512
WINDOW_ERROR = r"Prompt 0 has \d+ tokens for member 'tiny-qwen2'; with max_new_tokens=4 .* context window of 512 tokens"


def test_a_prompt_over_the_window_is_an_error_naming_the_sizes(tiny_llm: EnsembleLLM) -> None:
    with pytest.raises(ConfigError, match=WINDOW_ERROR):
        tiny_llm.complete(TOO_LONG)
    with pytest.raises(ConfigError, match=WINDOW_ERROR):
        tiny_llm.stream_chat(user(TOO_LONG))  # raised when called, before any chunk is asked for
    result = tiny_llm.complete("alpha beta")  # nothing was cut and nothing is stuck
    assert result.raw["usage"]["completion_tokens"] > 0


async def test_the_async_calls_raise_it_too(tiny_llm: EnsembleLLM) -> None:
    with pytest.raises(ConfigError, match=WINDOW_ERROR):
        await tiny_llm.acomplete(TOO_LONG)
    with pytest.raises(ConfigError, match=WINDOW_ERROR):
        [r async for r in await tiny_llm.astream_chat(user(TOO_LONG))]
    assert json.dumps((await tiny_llm.achat(user("alpha beta"))).raw)  # the raw response is JSON-friendly
