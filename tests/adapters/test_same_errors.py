"""The same user error raises the same exception, naming the same field, in both adapters.

Both adapters hand their call options to `ensemble_core.chat.request.build_request`, so a bad
option is a `ConfigError` (a `ValueError`) from the core, raised before any model is loaded,
whether the call is plain, streamed or async.
"""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from ensemble_core.errors import ConfigError
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
MULTIPLY = {**ADD, "function": {**ADD["function"], "name": "multiply", "description": "Multiply two integers."}}

# (the call's options, the field the message must name)
BAD_CALLS = [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"temperature": -1.0}, "`temperature`"),
    ({"top_p": 2.0}, "`top_p`"),
    ({"seed": -1}, "`seed`"),
    ({"stop": [""]}, "`stop`"),
    ({"tools": [ADD], "tool_choice": "divide"}, "`tool_choice`"),
    ({"tool_choice": "required"}, "`tool_choice`"),
    ({"tools": ["add"]}, "`tools[0]`"),
    ({"tools": [ADD, MULTIPLY], "tool_choice": "any", "parallel_tool_calls": "yes"}, "`parallel_tool_calls`"),
    ({"response_format": {"type": "xml"}}, "`response_format`"),
    ({"response_format": {"type": "json_schema"}}, "`response_format`"),
    ({"model": "gpt-4o"}, "model='gpt-4o'"),
]


@pytest.fixture
def adapters(monkeypatch: pytest.MonkeyPatch) -> tuple[ChatEnsemble, EnsembleLLM]:
    def no_loading(spec: Any) -> None:
        raise AssertionError("models were loaded before the call's options were checked")

    monkeypatch.setattr("langchain_ensemble.chat_model.shared_ensemble", no_loading)
    monkeypatch.setattr("llamaindex_ensemble.llm.shared_ensemble", no_loading)
    return ChatEnsemble(models=MODELS, method="gac"), EnsembleLLM(models=MODELS, method="gac", context_window=2048)


USER = [ChatMessage(role=MessageRole.USER, content="What is 2 plus 3?")]


def _errors(adapters: tuple[ChatEnsemble, EnsembleLLM], options: dict[str, Any]) -> list[BaseException]:
    chat, llm = adapters
    calls = [
        lambda: chat.invoke("What is 2 plus 3?", **options),
        lambda: list(chat.stream("What is 2 plus 3?", **options)),
        lambda: llm.chat(USER, **options),
        lambda: list(llm.stream_chat(USER, **options)),
        lambda: llm.complete("What is 2 plus 3?", **options),
    ]
    errors = []
    for call in calls:
        with pytest.raises(Exception) as caught:  # which type it is, is what is checked
            call()
        errors.append(caught.value)
    return errors


@pytest.mark.parametrize(("options", "field"), BAD_CALLS)
def test_a_bad_call_is_the_same_config_error_in_both_adapters(
    adapters: tuple[ChatEnsemble, EnsembleLLM], options: dict[str, Any], field: str
) -> None:
    for error in _errors(adapters, options):
        assert type(error) is ConfigError, repr(error)
        assert isinstance(error, ValueError)  # what LangChain callers catch
        assert field in str(error)


@pytest.mark.parametrize(("options", "field"), BAD_CALLS[:3])
async def test_the_async_calls_raise_it_too(
    adapters: tuple[ChatEnsemble, EnsembleLLM], options: dict[str, Any], field: str
) -> None:
    chat, llm = adapters
    for call in (chat.ainvoke("Hi", **options), llm.achat(USER, **options), llm.acomplete("Hi", **options)):
        with pytest.raises(ConfigError, match=field):
            await call


def test_each_adapter_names_its_own_setting_and_the_core_setting_it_feeds(
    adapters: tuple[ChatEnsemble, EnsembleLLM],
) -> None:
    chat, llm = adapters
    with pytest.raises(ConfigError, match="`max_new_tokens` has to be a positive integer") as from_langchain:
        chat.invoke("Hi", max_tokens=0)
    with pytest.raises(ConfigError, match="`max_new_tokens` has to be a positive integer") as from_llamaindex:
        llm.chat(USER, max_new_tokens=0)
    assert str(from_langchain.value) == str(from_llamaindex.value)
    with pytest.raises(ConfigError, match=r"ChatEnsemble got unknown call options \['max_new_tokens'\]; .*max_tokens"):
        chat.invoke("Hi", max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"EnsembleLLM got unknown call options \['max_tokens'\]; .*max_new_tokens"):
        llm.chat(USER, max_tokens=4)


@pytest.mark.parametrize("method", ["xml", "json"])
def test_structured_output_with_an_unknown_method_is_a_config_error(method: str) -> None:
    with pytest.raises(ConfigError, match="`method` has to be"):
        ChatEnsemble(models=MODELS).with_structured_output({"type": "object"}, method=method)  # type: ignore[arg-type]
