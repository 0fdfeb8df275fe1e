"""A LangChain agent (`langchain.agents.create_agent`) whose model is a two-model ensemble.

The agent calls a Python tool. Small models often answer in prose instead of calling a tool,
and keep calling tools once they have started, so a small middleware sets `tool_choice`: a
call is required until a tool has answered ("any"), then an answer in words ("none").
ChatEnsemble forces a call by starting the reply with the call's opening, in every member's
own tokens, and "none" hides the tools.

Run: `python examples/langchain_agent.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, wrap_model_call
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from transformers.utils import logging as hf_logging

from langchain_ensemble import ChatEnsemble

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


@tool
def word_length(word: str) -> int:
    """Count the letters of a word."""
    return len(word)


@wrap_model_call
def one_tool_call_then_answer(request: ModelRequest, handler: Any) -> Any:
    """A tool call first; once a tool has answered, a reply in words."""
    answered = any(isinstance(m, ToolMessage) for m in request.messages)
    return handler(request.override(tool_choice="none" if answered else "any"))


def build_agent(llm: ChatEnsemble) -> Any:
    return create_agent(
        llm,
        tools=[word_length],
        system_prompt="Use the tools to answer. Once a tool has answered, reply with one short sentence in words.",
        middleware=[one_tool_call_then_answer],
    )


def main() -> None:
    hf_logging.disable_progress_bar()
    llm = ChatEnsemble(models=MODELS, method="safe", method_params={"drafter": "qwen"}, max_tokens=48)
    agent = build_agent(llm)
    state = agent.invoke({"messages": [("user", "How many letters does the word 'ocean' have?")]})
    for message in state["messages"]:
        calls = getattr(message, "tool_calls", None)
        print(f"[{message.type}] {message.content!s}{f'  calls: {calls}' if calls else ''}")


if __name__ == "__main__":
    main()
