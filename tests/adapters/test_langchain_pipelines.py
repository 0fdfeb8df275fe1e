"""The RAG chain and the agent of the examples, end to end on the packaged models."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from langchain_ensemble import ChatEnsemble

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import langchain_agent
import langchain_rag

pytestmark = pytest.mark.packaged


class PromptRecorder(BaseCallbackHandler):
    """Keeps the messages every chat model call was given."""

    def __init__(self) -> None:
        self.prompts: list[list[Any]] = []

    def on_chat_model_start(self, serialized: Any, messages: list[list[Any]], **kwargs: Any) -> None:
        self.prompts.extend(messages)


@pytest.fixture(scope="module")
def llm() -> ChatEnsemble:
    return ChatEnsemble(models=langchain_rag.MODELS, method="safe", method_params={"drafter": "qwen"}, max_tokens=24)


def test_the_retrieved_passages_reach_the_prompt_and_the_answer_uses_them(llm: ChatEnsemble) -> None:
    recorder = PromptRecorder()
    answer = langchain_rag.build_chain(llm).invoke("How long can the Zephyr-9 fly?", config={"callbacks": [recorder]})
    [messages] = recorder.prompts
    system = messages[0].content
    assert "flight time of 42 minutes" in system and "charges fully in 55 minutes" in system
    assert "Harbor Cafe" not in system and "telescopes" not in system  # only the k=2 nearest passages
    assert messages[-1].content == "How long can the Zephyr-9 fly?"
    assert "42" in answer


def test_the_rag_chain_streams_the_same_answer(llm: ChatEnsemble) -> None:
    chain = langchain_rag.build_chain(llm)
    pieces = list(chain.stream("When does Harbor Cafe open?"))
    assert len(pieces) > 1
    assert "".join(pieces) == chain.invoke("When does Harbor Cafe open?")


def test_the_agent_calls_the_python_tool_with_parsed_arguments_then_answers(llm: ChatEnsemble) -> None:
    calls: list[dict[str, Any]] = []
    tool = langchain_agent.word_length

    original = tool.func
    tool.func = lambda word: calls.append({"word": word}) or original(word)
    try:
        state = langchain_agent.build_agent(llm).invoke({"messages": [("user", "How many letters are in 'ocean'?")]})
    finally:
        tool.func = original
    human, request, result, answer = state["messages"]
    assert isinstance(human, HumanMessage)
    assert isinstance(request, AIMessage) and [c["name"] for c in request.tool_calls] == ["word_length"]
    assert calls == [request.tool_calls[0]["args"]] and isinstance(calls[0]["word"], str)
    assert isinstance(result, ToolMessage) and result.content == str(len(calls[0]["word"]))
    assert result.tool_call_id == request.tool_calls[0]["id"]
    assert isinstance(answer, AIMessage) and answer.tool_calls == []
