"""A LlamaIndex `FunctionAgent` whose LLM is a two-model ensemble, calling a Python tool.

`initial_tool_choice` makes the first reply a call of the tool: `EnsembleLLM` starts the reply
with the call's opening, in every member's own tokens, so even these small models only write
the arguments. The tool returns its result directly (`return_direct=True`): the packaged
models are small enough that, shown a tool's result, they tend to call the tool again rather
than answer; with larger members, drop `return_direct` and the agent answers in words.

Run: `python examples/llamaindex_agent.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from llama_index.core.agent.workflow import FunctionAgent, ToolCall, ToolCallResult
from llama_index.core.tools import FunctionTool
from transformers.utils import logging as hf_logging

from llamaindex_ensemble import EnsembleLLM

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


def build_agent(llm: EnsembleLLM) -> FunctionAgent:
    return FunctionAgent(
        tools=[FunctionTool.from_defaults(multiply, return_direct=True)],
        llm=llm,
        system_prompt="You are a calculator. Use the tools to answer.",
        initial_tool_choice="multiply",
        allow_parallel_tool_calls=False,  # one call per reply: generation stops when the call closes
    )


async def main() -> None:
    hf_logging.disable_progress_bar()
    llm = EnsembleLLM(models=MODELS, method="safe", method_params={"drafter": "qwen"}, max_new_tokens=48)
    agent = build_agent(llm)
    question = "What is 17 times 23?"
    print(f"User: {question}")
    handler = agent.run(question)
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            print(f"  tool result: {event.tool_name}({event.tool_kwargs}) -> {event.tool_output.content}")
        elif isinstance(event, ToolCall):
            print(f"  tool call:   {event.tool_name}({event.tool_kwargs})")
    print(f"Agent: {await handler}")


if __name__ == "__main__":
    asyncio.run(main())
