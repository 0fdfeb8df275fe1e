"""`EnsembleLLM`: an ensemble of local models as a function-calling LlamaIndex LLM.

A thin adapter: LlamaIndex messages become the core's message dicts, settings become
generation settings, and the core's text stream becomes `ChatResponse`s. Rendering (each
member's own template), decoding, tool-call parsing and asyncio live in `ensemble_core`.
Completion is derived from chat, as LlamaIndex's chat-model integrations do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.generic_utils import (
    achat_to_completion_decorator,
    astream_chat_to_completion_decorator,
    chat_to_completion_decorator,
    stream_chat_to_completion_decorator,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, model_validator
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from ensemble_core.chat.reply import ReplyAssembler, read_reply
from ensemble_core.chat.request import ChatRequest, build_request
from ensemble_core.chat.tool_calls import resolve_tool_choice
from ensemble_core.config import build_settings
from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import ConfigError, ModelLoadError
from ensemble_core.loading import EnsembleSpec, adapter_source, shared_ensemble
from ensemble_core.results import StreamChunk
from llamaindex_ensemble.messages import to_core_messages, to_openai_tools
from llamaindex_ensemble.reply import chat_response, first_call_only, streamed_response, tool_selections

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool


class EnsembleLLM(FunctionCallingLLM):
    """Several local LLMs (with different tokenizers) writing one reply, as a LlamaIndex LLM.

    Build it from model names (loaded on first use, shared by every `EnsembleLLM` and
    `ChatEnsemble` with the same models and method) or from a loaded `Ensemble`:

    ```python
    from llama_index.core import Settings
    from llamaindex_ensemble import EnsembleLLM

    Settings.llm = EnsembleLLM(
        models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"],
        method="safe",
        method_params={"drafter": "qwen"},
        max_new_tokens=128,
    )
    ```

    Every request is a chat rendered by each member's own template (`complete` sends the
    prompt as one user message), so `messages_to_prompt`/`completion_to_prompt` are not used.
    Per call, `chat`/`complete` (and their stream/async forms) take `max_new_tokens`, `stop`
    (added to the field's), `temperature`, `top_p`, `seed`, `tools`, `tool_choice`,
    `parallel_tool_calls`, `response_format` (a JSON reply) and `model` (only its own name),
    read and checked by `ensemble_core.chat.request.build_request` as `ChatEnsemble`'s are;
    anything else is a `ConfigError`. Async calls run generation in a worker thread and never
    block the event loop; concurrent calls queue on the ensemble.
    """

    model_config = ConfigDict(extra="forbid")

    models: list[str | dict[str, Any]] | None = Field(
        default=None,
        description="The models: packaged names (`ensemble-llm models list`), Hub ids or local folders, or dicts "
        'giving one its own settings: {"model": ..., "name": ..., "device": ..., "dtype": ..., "model_kwargs": '
        '{"revision": ..., "trust_remote_code": ...}}.',
    )
    method: str = Field(
        default="gac",
        description='The ensemble method: "gac", "unite", "safe", "contrastive", "sweetspan", "specfuse" or "single".',
    )
    method_params: dict[str, Any] = Field(
        default_factory=dict,
        description='Parameters of the method, e.g. {"drafter": "qwen"} for SAFE. GaC, UniTE and SAFE get '
        '{"weights": "auto"} unless weights are given ("equal" keeps equal weights).',
    )
    ensemble: Ensemble | None = Field(
        default=None, exclude=True, description="An already loaded Ensemble to use instead of `models`/`method`."
    )
    device: str | None = Field(
        default=None,
        description='Where to load `models` ("cpu", "cuda:1"), unless an entry gives its own; default: the first '
        "GPU, else the CPU.",
    )
    dtype: str = Field(default="auto", description='Weights\' dtype for `models`: "auto", "bfloat16", "float32", ...')
    placement: str = Field(
        default="local",
        description='Where `models` run: "local" (this process), "ray" (each in a Ray actor, on the cluster at '
        '$RAY_ADDRESS or a local Ray) or a "ray://host:port" address.',
    )
    temperature: float = Field(default=0.0, description="0 means greedy decoding; above 0, sampling.")
    max_new_tokens: int = Field(default=256, description="The most tokens to generate per reply (`num_output`).")
    top_p: float = Field(default=1.0, description="Nucleus sampling mass (with temperature > 0).")
    stop: list[str] | None = Field(default=None, description="Stop strings; a call's own `stop` adds to these.")
    seed: int | None = Field(default=None, description="Seed for sampling (each call starts from it).")
    context_window: int | None = Field(
        default=None,
        description="The window LlamaIndex packs prompts into. None: the smallest member's window (read from "
        "the models' configs; no weights are loaded). A number may only be smaller, e.g. to leave room for "
        "tokenizers that count more tokens than LlamaIndex's; it is checked at once where the configs can be "
        "read here (local placement), else when the models load.",
    )

    _spec: EnsembleSpec | None = PrivateAttr(default=None)
    _loaded: Ensemble | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> EnsembleLLM:
        model_settings = {"method": self.method, "method_params": self.method_params, "device": self.device}
        self._spec = adapter_source(
            self.models,
            self.ensemble,
            {**model_settings, "dtype": self.dtype, "placement": self.placement},
            self.model_fields_set,
        )
        build_settings(**self._settings())  # bad temperature / max_new_tokens / stop fail now, with the field named
        if self.context_window is not None and self.context_window <= 0:
            raise ValueError(
                f"`context_window` has to be a positive number of tokens or None, but is {self.context_window}"
            )
        if self.context_window is not None and (self._spec is None or self._spec.placement == "local"):
            with contextlib.suppress(ModelLoadError):  # a config not readable here: checked when the models load
                self._check_window(self.ensemble.context_window if self._spec is None else self._spec.context_window())
        return self

    # ------------------------------------------------------------------ identity

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleLLM"

    @property
    def model_name(self) -> str:
        """The method and the members, e.g. `safe(qwen2.5-coder-0.5b-instruct+smollm2-135m-instruct)`."""
        return self.ensemble.model_name if self._spec is None else self._spec.model_name

    @property
    def metadata(self) -> LLMMetadata:
        """What LlamaIndex sizes prompts and memory by; the window is read from the models' configs
        (no weights are loaded)."""
        return LLMMetadata(
            context_window=self._window(),
            num_output=self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model_name,
        )

    def to_payload(self) -> dict[str, Any]:
        """What instrumentation events carry. Like `metadata` it never loads the models: LlamaIndex
        builds it inside async calls, where loading would block the event loop."""
        payload = {
            "class_name": self.class_name(),
            "model_name": self.model_name,
            "num_output": self.max_new_tokens,
            "is_chat_model": True,
            "is_function_calling_model": True,
            "temperature": self.temperature,
        }
        payload["context_window"] = self._window()
        return payload

    # ------------------------------------------------------------------ chat

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._request(messages, kwargs)
        result = self._get_ensemble().generate(request.prompt, **request.core_arguments)
        return chat_response(read_reply(request, result), self.model_name)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request = self._request(messages, kwargs)
        # `stream` renders (and checks the prompt fits) before it returns, so input errors raise here.
        chunks = self._get_ensemble().stream(request.prompt, **request.core_arguments)
        return self._responses(request, chunks)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = await asyncio.to_thread(self._request, messages, kwargs)  # may run the models (pick_tool)
        ensemble = await self._aget_ensemble()
        result = await ensemble.agenerate(request.prompt, **request.core_arguments)
        return chat_response(read_reply(request, result), self.model_name)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        request = await asyncio.to_thread(self._request, messages, kwargs)  # may run the models (pick_tool)
        ensemble = await self._aget_ensemble()
        return self._aresponses(request, ensemble.astream(request.prompt, **request.core_arguments))

    # ------------------------------------------------------------------ completion (derived from chat)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """`prompt` as one user message (`formatted` changes nothing: each member's template formats it)."""
        return chat_to_completion_decorator(self.chat)(prompt, **kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return stream_chat_to_completion_decorator(self.stream_chat)(prompt, **kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await achat_to_completion_decorator(self.achat)(prompt, **kwargs)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return await astream_chat_to_completion_decorator(self.astream_chat)(prompt, **kwargs)

    # ------------------------------------------------------------------ function calling

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The `chat` arguments for a call with tools.

        `tool_choice`: None/"auto" (the model decides), "none" (tools hidden), "required"/"any"
        or a tool name (a call is forced: the reply starts with the call's opening, so even a
        small model only writes the arguments). `tool_required=True` forces a call too.
        Without `allow_parallel_tool_calls`, generation stops after the first call.
        """
        openai_tools = to_openai_tools(tools)
        names = [t["function"]["name"] for t in openai_tools or []]
        messages = list(chat_history or [])  # never the caller's list
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        return {
            "messages": messages,
            "tools": openai_tools,
            "tool_choice": resolve_tool_choice(tool_choice, names, tool_required),
            "parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        return response if allow_parallel_tool_calls else first_call_only(response)

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The calls in `response` (parsed by `ensemble_core.chat.tool_calls` when it was generated).

        Raises:
            ValueError: no call and `error_on_no_tool_call`; the message quotes the reply, or
                the reason each attempted call is invalid.
        """
        return tool_selections(response, error_on_no_tool_call)

    # ------------------------------------------------------------------ internals

    def _settings(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "stop": self.stop,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatRequest:
        """The core request; messages and every option are checked before the ensemble is loaded."""
        options = {**kwargs, "tools": to_openai_tools(kwargs.get("tools"))} if "tools" in kwargs else kwargs
        return build_request(
            to_core_messages(messages),
            self._settings(),
            options,
            pick_tool=lambda prompt, tools: self._get_ensemble().pick_tool(prompt, tools),
            served=self.model_name,
            caller="EnsembleLLM",
            constrains=lambda: self._get_ensemble().constrains,
        )

    def _get_ensemble(self) -> Ensemble:
        if self._loaded is None:
            ensemble = self.ensemble if self._spec is None else shared_ensemble(self._spec)
            self._check_window(ensemble.context_window)
            self._loaded = ensemble
        return self._loaded

    async def _aget_ensemble(self) -> Ensemble:
        """The ensemble; a first load runs in a worker thread, so the event loop stays free."""
        if self._loaded is not None:
            return self._loaded
        return await asyncio.to_thread(self._get_ensemble)

    def _check_window(self, window: int | None) -> None:
        if self.context_window is not None and window and self.context_window > window:
            raise ConfigError(
                f"`context_window` is {self.context_window} tokens, but the smallest member window of "
                f"{self.model_name} is {window}; give at most {window}, or None to use it."
            )

    def _window(self) -> int:
        if self.context_window is not None:
            return self.context_window
        if self._loaded is None and self._spec is not None:
            window = self._spec.context_window()  # from the configs: metadata must not load the weights
        else:
            window = self._get_ensemble().context_window
        if not window:
            raise ConfigError("No member states its context window; give EnsembleLLM(context_window=...) in tokens.")
        return window

    def _responses(self, request: ChatRequest, chunks: Iterator[StreamChunk]) -> ChatResponseGen:
        assembler = ReplyAssembler(request)
        with contextlib.closing(chunks):  # leaving early ends the generation and frees the ensemble
            for chunk in chunks:
                if (response := streamed_response(assembler, chunk, self.model_name)) is not None:
                    yield response

    async def _aresponses(self, request: ChatRequest, chunks: AsyncIterator[StreamChunk]) -> ChatResponseAsyncGen:
        assembler = ReplyAssembler(request)
        try:
            async for chunk in chunks:
                if (response := streamed_response(assembler, chunk, self.model_name)) is not None:
                    yield response
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]  # stops the worker thread when left early
