"""`ChatEnsemble`: an ensemble of local models as a LangChain chat model.

A thin adapter: messages become the core's message dicts, settings become generation
settings, and the core's text stream becomes message chunks. Rendering (each member's own
template), decoding, tool-call parsing and asyncio live in `ensemble_core`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from ensemble_core.chat.reply import Reply, ReplyAssembler
from ensemble_core.chat.request import ChatRequest, build_request
from ensemble_core.chat.tool_calls import resolve_tool_choice
from ensemble_core.config import build_settings
from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import ConfigError
from ensemble_core.loading import EnsembleSpec, adapter_source, shared_ensemble
from ensemble_core.results import StreamChunk
from langchain_ensemble.messages import to_core_messages
from langchain_ensemble.reply import chat_result, event_chunk, last_chunk

_RENAMED = {"max_tokens": "max_new_tokens"}  # LangChain's name for the core setting


class ChatEnsemble(BaseChatModel):
    """Several local LLMs (with different tokenizers) writing one reply, as a LangChain chat model.

    Build it from model names (loaded on first use, shared by every `ChatEnsemble` with the
    same models and method) or from a loaded `Ensemble` (which a LlamaIndex `EnsembleLLM`
    can use at the same time):

    ```python
    from langchain_ensemble import ChatEnsemble

    llm = ChatEnsemble(
        models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"],
        method="safe",
        method_params={"drafter": "qwen"},
        max_tokens=128,
    )
    llm.invoke("Name three prime numbers.").content
    ```

    Unknown keyword arguments are an error. Requests that arrive together (`batch`,
    `abatch`, threads, tasks) are served one after the other on the ensemble, never
    interleaved; async calls run in a worker thread and never block the event loop.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    models: list[str | dict[str, Any]] | None = None
    """The models: packaged names (`ensemble-llm models list`), Hub ids or local folders, or dicts
    giving one its own settings: `{"model": ..., "name": ..., "device": ..., "dtype": ...,
    "model_kwargs": {"revision": ..., "trust_remote_code": ...}}`."""
    method: str = "gac"
    """The ensemble method: "gac", "unite", "safe", "contrastive", "sweetspan", "specfuse" or "single"."""
    method_params: dict[str, Any] = Field(default_factory=dict)
    """Parameters of the method, e.g. `{"drafter": "qwen"}` for SAFE. GaC, UniTE and SAFE get
    `{"weights": "auto"}` unless weights are given (`"equal"` keeps equal weights)."""
    ensemble: Ensemble | None = Field(default=None, exclude=True)
    """An already loaded `Ensemble` to use instead of `models`/`method`."""
    device: str | None = None
    """Where to load `models` ("cpu", "cuda", "cuda:1"), unless an entry gives its own; default: the
    first GPU, else the CPU."""
    dtype: str = "auto"
    """Weights' dtype for `models`: "auto" (the checkpoint's), "bfloat16", "float16", "float32"."""
    placement: str = "local"
    """Where `models` run: "local" (this process), "ray" (each in a Ray actor, on the cluster at
    `$RAY_ADDRESS` or a local Ray) or a "ray://host:port" address; `pip install 'ensemble-llm[ray]'`."""
    temperature: float = 0.0
    """0 means greedy decoding; above 0, sampling."""
    max_tokens: int = 256
    """The most tokens to generate per reply."""
    top_p: float = 1.0
    """Nucleus sampling mass (with temperature > 0)."""
    stop: list[str] | None = None
    """Stop strings; a call's own `stop` adds to these."""
    seed: int | None = None
    """Seed for sampling (each call starts from it, so sampled replies repeat)."""
    timeout: float | None = None
    """Seconds a reply may take; past it generation stops and `TimeoutError` is raised."""
    max_retries: int = 0
    """Accepted for drop-in compatibility with API chat models. Local generation has no
    transient failures, so a failed call is never retried, whatever this says."""
    streaming: bool = False
    """Whether `invoke` streams internally (callbacks then see every token)."""

    _spec: EnsembleSpec | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> ChatEnsemble:
        model_settings = {"method": self.method, "method_params": self.method_params, "device": self.device}
        self._spec = adapter_source(
            self.models,
            self.ensemble,
            {**model_settings, "dtype": self.dtype, "placement": self.placement},
            self.model_fields_set,
        )
        build_settings(**self._settings())  # bad temperature / max_tokens / stop fail now, with the field named
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"`timeout` has to be a positive number of seconds or None, but is {self.timeout}")
        if self.max_retries < 0:
            raise ValueError(f"`max_retries` has to be >= 0, but is {self.max_retries}")
        return self

    # ------------------------------------------------------------------ identity

    @property
    def _llm_type(self) -> str:
        return "ensemble-llm"

    @property
    def model_name(self) -> str:
        """The method and the members, e.g. `safe(qwen2.5-coder-0.5b-instruct+smollm2-135m-instruct)`."""
        return self.ensemble.model_name if self._spec is None else self._spec.model_name

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, **self._settings()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="ensemble-llm",
            ls_model_name=kwargs.get("model") or self.model_name,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if stops := self._merged_stop(stop):
            params["ls_stop"] = stops
        return params

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of `text` in the reference member's tokenizer (local; never a download)."""
        ensemble = self._get_ensemble()
        return ensemble.reference_member.encode_text(text)

    # ------------------------------------------------------------------ tools and structured output

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer tools: each member's template renders them; calls in the reply are parsed.

        `tool_choice`: None/"auto" (the model decides), "none" (tools hidden), "any"/"required"/
        True (a call is forced), a tool name or `{"type": "function", "function": {"name": ...}}`
        (that tool is forced). A forced call starts the reply with the call's opening, so even
        a small model only has to write the arguments.
        """
        formatted = [convert_to_openai_tool(tool, strict=strict) for tool in tools]
        names = [t["function"]["name"] for t in formatted]
        return super().bind(tools=formatted, tool_choice=resolve_tool_choice(tool_choice, names), **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Replies parsed into `schema` (a pydantic class, a TypedDict or a JSON schema).

        `method`: "function_calling" (a forced call of a tool shaped like the schema; the base
        class's implementation on `bind_tools`), "json_schema" (the schema is put in the
        system message and the reply starts with `{`), or "json_mode" (a JSON object is asked
        for; describe the keys in your prompt).
        """
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        if method not in ("json_schema", "json_mode"):
            raise ConfigError(
                f"`method` has to be 'function_calling', 'json_schema' or 'json_mode', but is {method!r}."
            )
        if kwargs:
            raise ConfigError(f"with_structured_output got unsupported arguments {sorted(kwargs)}.")
        response_format: dict[str, Any] = {"type": "json_object"}
        if method == "json_schema":
            response_format = {"type": "json_schema", "schema": convert_to_json_schema(schema)}
        llm = self.bind(
            response_format=response_format,
            ls_structured_output_format={"kwargs": {"method": method, "strict": strict}, "schema": schema},
        )
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([unparsed], exception_key="parsing_error")

    # ------------------------------------------------------------------ generation

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        assembler = ReplyAssembler(request)
        for core_chunk in self._core_stream(request):
            assembler.feed(core_chunk)
        return chat_result(self._finished(assembler.reply), self.model_name)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = await asyncio.to_thread(self._request, messages, stop, kwargs)  # may run the models (pick_tool)
        assembler = ReplyAssembler(request)
        async for core_chunk in self._core_astream(request):
            assembler.feed(core_chunk)
        return chat_result(self._finished(assembler.reply), self.model_name)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        request = self._request(messages, stop, kwargs)
        assembler = ReplyAssembler(request)
        for core_chunk in self._core_stream(request):
            for chunk in self._chunks(assembler, core_chunk):
                if run_manager is not None:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk
        self._finished(assembler.reply)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        request = await asyncio.to_thread(self._request, messages, stop, kwargs)  # may run the models (pick_tool)
        assembler = ReplyAssembler(request)
        async for core_chunk in self._core_astream(request):
            for chunk in self._chunks(assembler, core_chunk):
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk
        self._finished(assembler.reply)

    # ------------------------------------------------------------------ internals

    def _get_ensemble(self) -> Ensemble:
        return self.ensemble if self._spec is None else shared_ensemble(self._spec)

    def _settings(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_tokens,
            "stop": self.stop,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }

    def _merged_stop(self, stop: Sequence[str] | None) -> list[str]:
        return list(dict.fromkeys([*(self.stop or []), *(stop or [])]))

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> ChatRequest:
        """The core request; messages and every option are checked before the ensemble is loaded."""
        return build_request(
            to_core_messages(messages),
            self._settings(),
            {**kwargs, "stop": stop},
            pick_tool=lambda prompt, tools: self._get_ensemble().pick_tool(prompt, tools),
            served=self.model_name,
            caller="ChatEnsemble",
            renamed=_RENAMED,
            constrains=lambda: self._get_ensemble().constrains,
        )

    def _chunks(self, assembler: ReplyAssembler, core_chunk: StreamChunk) -> list[ChatGenerationChunk]:
        """The LangChain chunks one core chunk settles (the last one closes with usage and metadata)."""
        chunks = [event_chunk(event) for event in assembler.feed(core_chunk)]
        if assembler.reply is not None:
            chunks.append(last_chunk(assembler.reply, self.model_name))
        return chunks

    def _core_stream(self, request: ChatRequest) -> Iterator[StreamChunk]:
        cancel = threading.Event()
        timer = self._start_timer(cancel)
        try:
            yield from self._get_ensemble().stream(request.prompt, cancel=cancel, **request.core_arguments)
        finally:
            if timer is not None:
                timer.cancel()

    async def _core_astream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        cancel = threading.Event()
        timer = self._start_timer(cancel)
        try:
            ensemble = await asyncio.to_thread(self._get_ensemble)  # a first load must not block the event loop
            async for chunk in ensemble.astream(request.prompt, cancel=cancel, **request.core_arguments):
                yield chunk
        finally:
            if timer is not None:
                timer.cancel()

    def _start_timer(self, cancel: threading.Event) -> threading.Timer | None:
        if self.timeout is None:
            return None
        timer = threading.Timer(self.timeout, cancel.set)
        timer.daemon = True
        timer.start()
        return timer

    def _finished(self, reply: Reply | None) -> Reply:
        """The reply, or the timeout that cut the generation short."""
        if reply is None:
            raise TimeoutError(
                f"ChatEnsemble stopped generating after timeout={self.timeout} s; "
                "raise `timeout` or lower `max_tokens`."
            )
        return reply
