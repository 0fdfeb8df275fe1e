"""LlamaIndex pipelines running on `EnsembleLLM` end to end, on the real packaged models.

Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE (Qwen drafts, both verify), greedy, on the CPU: a
query engine (streaming and not), the four chat-engine modes, a `FunctionAgent` with a Python
tool and `structured_predict` (a forced tool call). Concurrent async calls, whose claim holds
whatever the text says, run on tiny random-weight members. A recorder wraps the loaded ensemble,
so the tests see each member's rendered prompt (decoded from its own token ids) and each
generated text.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.types import ChatMode
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel

from ensemble_core import Ensemble, StreamChunk
from ensemble_core.errors import ConfigError
from ensemble_core.loading import EnsembleSpec, shared_ensemble
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from offline_embeddings import llamaindex_embeddings

pytestmark = pytest.mark.packaged

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
# Equal weights, said explicitly: these tests check the adapter's mechanics on the text this pair
# writes with them (the front ends' default, "auto", is tested in tests/test_loading.py and runs in
# the docs' snippets).
METHOD = {"method": "safe", "method_params": {"drafter": "qwen", "weights": "equal"}}
FACT = "The Varnholt lighthouse was painted teal in 1987 by the harbour guild."
DOCUMENTS = [
    FACT,
    "Brindle cheese is aged for nine months in limestone caves near Oskar Falls.",
    "The Quillon river freezes every January, and skaters race across it at dawn.",
]
QUESTION = "What colour was the Varnholt lighthouse painted?"
HISTORY = [
    ChatMessage(role=MessageRole.USER, content="Tell me about the Varnholt lighthouse."),
    ChatMessage(role=MessageRole.ASSISTANT, content="It is a lighthouse by the harbour."),
]


@pytest.fixture(scope="module")
def llm() -> EnsembleLLM:
    return EnsembleLLM(models=MODELS, **METHOD, max_new_tokens=32)


@pytest.fixture(scope="module")
def index() -> VectorStoreIndex:
    return VectorStoreIndex.from_documents([Document(text=t) for t in DOCUMENTS], embed_model=llamaindex_embeddings())


@dataclass
class Recorder:
    """Each member's rendered prompts (as text), and the text of each generation, in order."""

    ensemble: Ensemble
    prompts: dict[str, list[str]] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)

    def last_prompts(self) -> list[str]:
        """The latest prompt of every member."""
        return [prompts[-1] for prompts in self.prompts.values()]


@pytest.fixture
def recorder(llm: EnsembleLLM, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    ensemble = llm._get_ensemble()
    recorder = Recorder(ensemble, {m.name: [] for m in ensemble.members})
    for member in ensemble.members:

        def render(prompt: Any, tools: Any = None, reply_prefix: str = "", member: Any = member) -> Any:
            rendered = type(member).render(member, prompt, tools, reply_prefix)
            recorder.prompts[member.name].append(member.tokenizer.decode(rendered.ids))
            return rendered

        monkeypatch.setattr(member, "render", render)

    stream, generate = ensemble.stream, ensemble.generate

    def recorded_stream(prompt: Any, **arguments: Any) -> Iterator[StreamChunk]:
        chunks = stream(prompt, **arguments)

        def chunks_seen() -> Iterator[StreamChunk]:
            for chunk in chunks:
                if chunk.result is not None:
                    recorder.texts.append(chunk.result.text)
                yield chunk

        return chunks_seen()

    def recorded_generate(prompt: Any, **arguments: Any) -> Any:
        result = generate(prompt, **arguments)
        recorder.texts.append(result.text)
        return result

    monkeypatch.setattr(ensemble, "stream", recorded_stream)  # astream and agenerate go through `stream`
    monkeypatch.setattr(ensemble, "generate", recorded_generate)
    return recorder


def test_the_loaded_ensemble_is_shared(llm: EnsembleLLM) -> None:
    spec = EnsembleSpec.build(MODELS, METHOD["method"], METHOD["method_params"])
    assert llm._get_ensemble() is shared_ensemble(spec)
    assert EnsembleLLM(models=MODELS, **METHOD)._get_ensemble() is llm._get_ensemble()
    assert ChatEnsemble(models=MODELS, **METHOD)._get_ensemble() is llm._get_ensemble()  # one copy of the weights
    assert llm.metadata.context_window == min(m.context_window for m in llm._get_ensemble().members) == 8192


def test_query_engine_answers_from_the_retrieved_node(llm: EnsembleLLM, index: VectorStoreIndex, recorder: Recorder):
    response = index.as_query_engine(llm=llm, similarity_top_k=1).query(QUESTION)
    assert response.source_nodes[0].node.get_content() == FACT
    assert all(FACT in prompt and QUESTION in prompt for prompt in recorder.last_prompts())
    assert str(response) == recorder.texts[-1]
    assert "teal" in str(response).lower()  # only the retrieved node says so

    streaming = index.as_query_engine(llm=llm, similarity_top_k=1, streaming=True).query(QUESTION)
    tokens = list(streaming.response_gen)
    assert len(tokens) > 1
    assert "".join(tokens) == recorder.texts[-1] == str(response)  # greedy: streaming changes nothing
    assert all(FACT in prompt for prompt in recorder.last_prompts())


@pytest.mark.parametrize(
    ("mode", "generations", "sees_node"),
    [
        (ChatMode.SIMPLE, 1, False),
        (ChatMode.CONTEXT, 1, True),
        (ChatMode.CONDENSE_QUESTION, 2, True),  # condense, then query
        (ChatMode.CONDENSE_PLUS_CONTEXT, 2, True),  # condense (to retrieve), then answer
    ],
)
def test_chat_engine_modes(
    mode: ChatMode,
    generations: int,
    sees_node: bool,
    llm: EnsembleLLM,
    index: VectorStoreIndex,
    recorder: Recorder,
) -> None:
    engine = index.as_chat_engine(chat_mode=mode, llm=llm, similarity_top_k=1)
    response = engine.chat("What colour was it painted?", chat_history=list(HISTORY))
    assert len(recorder.texts) == generations
    assert str(response) == recorder.texts[-1]
    first_prompts = [prompts[0] for prompts in recorder.prompts.values()]
    assert all(HISTORY[1].content in prompt for prompt in first_prompts)  # the history reached the members
    final_prompts = recorder.last_prompts()
    assert all((FACT in prompt) == sees_node for prompt in final_prompts)
    if mode == ChatMode.CONDENSE_QUESTION:  # the condensed question is what the query engine answers
        assert all(recorder.texts[0].strip() in prompt for prompt in final_prompts)
    if sees_node:
        assert "teal" in str(response).lower()


# LlamaIndex's workflows inspect the agent's pydantic attributes, which pydantic reports as deprecated.
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211")
@pytest.mark.parametrize(("streaming", "parallel"), [(True, True), (False, False)])
async def test_function_agent_calls_a_python_tool(
    streaming: bool, parallel: bool, llm: EnsembleLLM, recorder: Recorder
) -> None:
    calls: list[tuple[int, int]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers and return the product."""
        calls.append((a, b))
        return a * b

    # return_direct: the tool's output is the answer (the small models would call the tool again).
    tool = FunctionTool.from_defaults(multiply, return_direct=True)
    agent = FunctionAgent(
        tools=[tool], llm=llm, initial_tool_choice="multiply", streaming=streaming, allow_parallel_tool_calls=parallel
    )
    handler = agent.run("What is 6 times 7?")
    results = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
    output = await handler
    assert calls == [(6, 7)]
    assert [(r.tool_name, r.tool_kwargs, r.tool_output.content) for r in results] == [
        ("multiply", {"a": 6, "b": 7}, "42")
    ]
    assert str(output) == "42"
    assert [(c.tool_name, c.tool_kwargs) for c in output.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    # the tool reached every member through its own template (SmolLM2's gets a tools section)
    assert all("Multiply two integers" in prompt for prompt in recorder.last_prompts())


class City(BaseModel):
    """A city and the country it is in."""

    name: str
    country: str


def test_structured_predict_reads_a_forced_tool_call(llm: EnsembleLLM, recorder: Recorder) -> None:
    # LlamaIndex's function-calling program asks for the call with tool_required=True.
    city = llm.structured_predict(City, PromptTemplate("Extract the city: {text}"), text="I flew into Lyon, France.")
    assert city == City(name="Lyon", country="France")
    # SAFE honours constraints: the call's opening was forced by its grammar, the arguments the members wrote
    assert recorder.texts[-1] == '<tool_call>\n{"name": "City", "arguments": {"name": "Lyon", "country": "France"}}'


async def test_concurrent_async_calls_give_the_sequential_texts(tiny_chat_ensemble: Ensemble) -> None:
    """On tiny random-weight models (conftest's `tiny_chat_ensemble`): the claim holds whatever the text says."""
    llm = EnsembleLLM(ensemble=tiny_chat_ensemble)
    prompts = [f"Name {word}." for word in ("a colour", "a fruit", "a planet")]
    prompts.append("Count to three.")
    sequential = [llm.complete(p, max_new_tokens=8).text for p in prompts]
    assert len(set(sequential)) > 1

    ticks = 0

    async def ticker(done: asyncio.Event) -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    async def streamed(prompt: str) -> str:
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        responses = [r async for r in await llm.astream_chat(messages, max_new_tokens=8)]
        assert "".join(r.delta or "" for r in responses) == responses[-1].message.content
        return responses[-1].message.content or ""

    done = asyncio.Event()
    ticking = asyncio.create_task(ticker(done))
    completed = await asyncio.gather(*(llm.acomplete(p, max_new_tokens=8) for p in prompts))
    streamed_texts = await asyncio.gather(*(streamed(p) for p in prompts))
    done.set()
    await ticking
    assert [c.text for c in completed] == sequential
    assert streamed_texts == sequential
    assert ticks > 20  # a blocked event loop would barely tick while 8 replies are generated


def test_a_prompt_over_the_members_window_is_an_error(llm: EnsembleLLM, recorder: Recorder) -> None:
    with pytest.raises(ConfigError, match=r"has \d+ tokens for member .* context window of 8192 tokens"):
        llm.complete("lighthouse " * 9000)
    assert recorder.texts == []  # nothing was generated, nothing was cut
