"""`Ensemble`: members + a method -> `generate`, `stream`, `generate_batch` (and their async forms)."""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import torch

from ensemble_core import aio
from ensemble_core.chat.templates import Prompt, Tools, check_text, prompt_text, validate_prompt, validate_tools
from ensemble_core.chat.tool_calls import forced_call_prefix
from ensemble_core.config import GenerationSettings, SettingsKwargs, build_settings
from ensemble_core.decode import DecodeLoop, decode
from ensemble_core.errors import ClosedError, ConfigError
from ensemble_core.members.base import Member
from ensemble_core.members.contract import Boundary, Candidate, RenderedPrompt, RequestId
from ensemble_core.members.lanes import Lanes, lane_key
from ensemble_core.methods.base import Binding, Method, resolve_method
from ensemble_core.methods.weighting import PROMPT_BYTES, WeightRule, prompt_weights
from ensemble_core.openmp import release_openmp_workers
from ensemble_core.results import GenerationResult, StreamChunk
from ensemble_core.vocab.union import forget_union


@dataclass(frozen=True)
class PreparedRequest:
    """One checked, rendered request waiting to join a running batch (`Ensemble.prepare`)."""

    prompt: Prompt
    rendered: dict[int, RenderedPrompt]  # per participant
    settings: GenerationSettings


def resolve_boundary(boundary: Boundary | str) -> Boundary:
    """A `Boundary` from itself or its name ("correct" or "retokenize")."""
    if isinstance(boundary, Boundary):
        return boundary
    try:
        return Boundary(boundary)
    except ValueError:
        known = [b.value for b in Boundary]
        raise ConfigError(f"`boundary` has to be one of {known}, but is {boundary!r}.") from None


class Ensemble:
    """Several members writing one answer together, under one decoding method.

    Args:
        members: loaded members (e.g. `HFMember.from_pretrained(...)`); names must be unique.
        method: a `Method` instance or a registry name ("single", "gac", "safe", ...).
        method_params: parameters for a method given by name.
        boundary: how members continue text they did not write: "correct" (default; the
            prompt-boundary-correct distribution, docs/explanation/prompt-boundary.md) or "retokenize" (re-encode
            the text and predict the next whole token, for comparison).

    The ensemble owns its members from here on: `close()` (or leaving a `with` block) releases
    their models. Methods combine distributions on the device of the method's reference member
    (the first member, or the drafter / primary / single member).

    Example:
        >>> qwen = HFMember.from_pretrained("qwen2.5-coder-0.5b-instruct")  # doctest: +SKIP
        >>> with Ensemble([qwen], method="single") as ens:  # doctest: +SKIP
        ...     ens.generate([{"role": "user", "content": "Hi"}], max_new_tokens=16).text
    """

    def __init__(
        self,
        members: Sequence[Member] | Member,
        method: Method | str = "single",
        method_params: Mapping[str, Any] | None = None,
        boundary: Boundary | str = Boundary.CORRECT,
    ):
        listed = [members] if isinstance(members, Member) else list(members)
        if not listed:
            raise ConfigError("`members` is empty; an ensemble needs at least one member.")
        for index, member in enumerate(listed):
            if not isinstance(member, Member):
                raise ConfigError(
                    f"`members[{index}]` must be a Member (e.g. HFMember.from_pretrained(...)), "
                    f"but is {type(member).__name__}."
                )
        names = [m.name for m in listed]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"Member names must be unique, but {duplicates} appear more than once; "
                "give each member its own `name=` when loading it."
            )
        self.members = listed
        self.method = resolve_method(method, method_params)
        self.boundary = resolve_boundary(boundary)
        self.binding: Binding = self.method.bind([m.vocab for m in listed])
        # Members in different lanes (GPUs, CPU thread budgets) step concurrently.
        self._lanes = Lanes(
            {i: lane_key(m.vocab.device, m.num_threads, m.name, m.remote) for i, m in enumerate(listed)},
            {i: m.num_threads for i, m in enumerate(listed)},
        )
        weakref.finalize(self, self._lanes.close)  # an ensemble dropped without close() ends its lanes
        # Members own stateful models; one generation runs at a time per ensemble.
        self._lock = threading.Lock()
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        release_openmp_workers()  # the loading thread's; generation may well run in another thread

    def __repr__(self) -> str:
        return (
            f"Ensemble(members={[m.name for m in self.members]}, method={self.method!r}, "
            f"boundary={self.boundary.value!r})"
        )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Release the members' models and everything built for them (the union vocabulary,
        the shared-ensemble cache entry). A closed ensemble raises `ClosedError` when used."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lanes.close()
            for member in self.members:
                member.close()
            if "union" in self.binding.cache:
                forget_union(self.binding.cache["union"])
            self.binding.cache.clear()
            callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the ensemble closes (e.g. to drop it from a cache)."""
        self._on_close.append(callback)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Ensemble:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("This ensemble was closed (its models are released); build a new one.")

    # ------------------------------------------------------------------ public calls

    def generate(
        self,
        prompt: Prompt,
        *,
        tools: Tools = None,
        reply_prefix: str = "",
        **settings: Unpack[SettingsKwargs],
    ) -> GenerationResult:
        """Generate for one prompt: a `str` (raw completion) or a list of chat messages.

        Args:
            prompt: a `str` (raw completion) or a list of `{"role", "content"}` messages
                (also `tool_calls` on assistant turns and `"tool"` results).
            tools: OpenAI-style tool definitions, rendered by each member's own template
                (or as a tools section where a template has none; see `chat.conversation`).
            reply_prefix: text the reply is made to begin with (in every member's tokens,
                after the generation prompt); not part of `result.text`. Forces a format,
                e.g. the opening of a tool call.
            settings: (all optional; see `GenerationSettings`) `max_new_tokens` (256), `stop`,
                `temperature` (0: greedy), `top_p` (1.0), `seed`. An unknown one is a `ConfigError`.
        """
        return self._collect([prompt], build_settings(**settings), tools, reply_prefix)[0]

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        tools: Tools = None,
        reply_prefix: str = "",
        **settings: Unpack[SettingsKwargs],
    ) -> list[GenerationResult]:
        """Generate for many prompts at once (one batched forward per step); results in order.

        Arguments as for `generate`; `tools` and `reply_prefix` apply to every prompt.
        """
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ConfigError("`prompts` must be a list of prompts; for one prompt use `generate`.")
        if len(prompts) == 0:
            raise ConfigError("`prompts` is an empty list; give at least one prompt.")
        return self._collect(list(prompts), build_settings(**settings), tools, reply_prefix)

    def stream(
        self,
        prompt: Prompt,
        *,
        tools: Tools = None,
        reply_prefix: str = "",
        cancel: threading.Event | None = None,
        **settings: Unpack[SettingsKwargs],
    ) -> Iterator[StreamChunk]:
        """Yield text as it is committed; the last chunk carries `finish_reason` and `result`.

        Arguments as for `generate`, plus `cancel`: once that event is set (from any thread),
        generation stops after the current step and the iterator ends without a result.
        Text that could still become a stop string is held back until it cannot. Input is
        checked (and prompts rendered) before this returns; the ensemble is held only while
        the iterator runs, and closing it early (`close()`, or leaving a `for` loop) ends the
        generation and frees the ensemble for the next call.
        """
        checked = build_settings(**settings)
        rendered = self._render([prompt], checked, tools, reply_prefix)
        return self._locked_stream([prompt], rendered, checked, cancel)

    async def agenerate(
        self, prompt: Prompt, *, tools: Tools = None, reply_prefix: str = "", **settings: Unpack[SettingsKwargs]
    ) -> GenerationResult:
        """`generate` for asyncio: the work runs in a worker thread; cancelling the task stops it."""
        return await aio.last_result(self.astream(prompt, tools=tools, reply_prefix=reply_prefix, **settings))

    def astream(
        self,
        prompt: Prompt,
        *,
        tools: Tools = None,
        reply_prefix: str = "",
        cancel: threading.Event | None = None,
        **settings: Unpack[SettingsKwargs],
    ) -> AsyncIterator[StreamChunk]:
        """`stream` for asyncio: never blocks the event loop; closing or cancelling it stops
        generation. Input is checked here, before anything runs (as `stream` does)."""
        cancel = cancel or threading.Event()
        chunks = self.stream(prompt, tools=tools, reply_prefix=reply_prefix, cancel=cancel, **settings)
        return aio.iterate_in_thread(chunks, cancel)

    # ------------------------------------------------------------------ continuous batching

    def prepare(
        self, prompt: Prompt, *, tools: Tools = None, reply_prefix: str = "", **settings: Unpack[SettingsKwargs]
    ) -> PreparedRequest:
        """Check and render one request without generating (arguments as for `generate`), so
        a server rejects bad input before queueing it; `admit` it into a `DecodeLoop` later."""
        checked = build_settings(**settings)
        rendered = self._render([prompt], checked, tools, reply_prefix)
        return PreparedRequest(prompt, {m: found[0] for m, found in rendered.items()}, checked)

    def open_loop(self, settings: GenerationSettings) -> DecodeLoop:
        """An empty running batch for requests of these settings' `batch_key` (see `batching`).
        Its steps must run while holding the ensemble (`hold`)."""
        self._check_open()
        return DecodeLoop(self.members, self.binding, settings, self.boundary, self.combining_device, self._lanes)

    def admit(self, loop: DecodeLoop, requests: Sequence[PreparedRequest]) -> list[RequestId]:
        """Prepared requests join a running batch at its next step (their prompt weights are
        found here, under the method's rule). Call while holding the ensemble (`hold`)."""
        weights = self._prompt_weights([r.prompt for r in requests])
        prompts = {m: [r.rendered[m] for r in requests] for m in self.binding.participants}
        return loop.admit(prompts, [r.settings for r in requests], weights)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The ensemble to oneself for a while (one step of a running batch): waits for any
        other call to end; raises `ClosedError` when the ensemble is closed."""
        with self._lock:
            self._check_open()
            yield

    @contextlib.contextmanager
    def _occupied(self) -> Iterator[None]:
        """The ensemble for one whole call. On leaving, this thread gives back its OpenMP
        workers (`ensemble_core.openmp`): the next call may come from another thread, whose
        parallel regions would otherwise be throttled by this thread's idle pool."""
        with self.hold():
            try:
                yield
            finally:
                release_openmp_workers()

    def pick_tool(self, prompt: Prompt, tools: Tools) -> str:
        """The tool the ensemble finds likeliest to call next, when a call is required.

        Every tool's name is scored as the continuation of the forced call opening
        (`... "name": "` + name + `"`; see `option_probabilities`). A small model asked to
        write the name itself may invent one; this choice is always a real tool.
        """
        checked = validate_tools(tools)
        if not checked:
            raise ConfigError("`pick_tool` needs at least one tool.")
        names = [t["function"]["name"] for t in checked]
        if len(names) == 1:
            return names[0]
        options = [json.dumps(name, ensure_ascii=False)[1:] for name in names]
        [shares] = self.option_probabilities(
            [prompt], [options], tools=checked, reply_prefix=forced_call_prefix(checked, "any")
        )
        return names[max(range(len(names)), key=shares.__getitem__)]

    def option_probabilities(
        self,
        prompts: Sequence[Prompt],
        options: Sequence[Sequence[str]],
        *,
        tools: Tools = None,
        reply_prefix: str = "",
    ) -> list[list[float]]:
        """Per prompt, the ensemble's probability of each of its options as the reply's start.

        Each participant scores every option as a continuation of the prompt (all prompts and
        options in ONE forward per member); its probabilities are normalised over the prompt's
        options and combined by the method (`Method.combine_options`: averaged with its weights;
        contrastive decoding contrasts them). This is how multiple-choice questions are
        answered by probabilities (" A" vs " B" after "Answer:") and how `pick_tool` picks.
        """
        if isinstance(prompts, str) or len(prompts) != len(options):
            raise ConfigError("`prompts` and `options` must be lists of the same length (options per prompt).")
        for index, choices in enumerate(options):
            if isinstance(choices, str) or not choices or not all(isinstance(c, str) and c for c in choices):
                raise ConfigError(f"`options[{index}]` must be a non-empty list of non-empty strings.")
        rendered = self._render(list(prompts), build_settings(max_new_tokens=1), validate_tools(tools), reply_prefix)
        requests = [RequestId(index) for index in range(len(prompts))]
        candidates = [[Candidate(choice.encode("utf-8")) for choice in choices] for choices in options]
        with self._occupied():
            weights = self._prompt_weights(list(prompts)) or [self.binding.weights] * len(prompts)

            def scores_of(m: int) -> list:
                session = self.members[m].start(dict(zip(requests, rendered[m], strict=True)), self.boundary)
                try:
                    return session.score(requests, candidates)
                finally:
                    session.drop(requests)

            found = self._lanes.each(rendered, scores_of)
        combined = []
        for index in range(len(prompts)):
            shares = {
                m: torch.softmax(torch.tensor([float(score.values.sum()) for score in scores[index]]), dim=0)
                for m, scores in found.items()
            }
            combined.append(self.binding.method.combine_options(self.binding, shares, weights[index]).tolist())
        return combined

    @property
    def context_window(self) -> int:
        """Tokens the smallest member can hold (0: no member states a limit)."""
        windows = [m.context_window for m in self.members if m.context_window]
        return min(windows, default=0)

    @property
    def model_name(self) -> str:
        """A readable identifier for tracing: the method and the members, e.g. `safe(qwen+smol)`."""
        return f"{self.method.name}({'+'.join(m.name for m in self.members)})"

    @property
    def constrains(self) -> bool:
        """Whether the method honours `constraint=` (docs/guides/constraints.md)."""
        return self.binding.method.constraint_refusal is None

    @property
    def combining_device(self) -> torch.device:
        """Where the method combines the members' distributions: the reference member's device
        (the drafter's, the primary's, the single member's, else the first member's). Each
        member's distribution moves there once per step; the union's maps move there once."""
        return self.members[self.binding.reference].vocab.device

    @property
    def reference_member(self) -> Member:
        """The member whose tokens count the headline usage (the drafter, primary, single member...)."""
        return self.members[self.binding.reference]

    # ------------------------------------------------------------------ internals

    def _locked_stream(
        self,
        prompts: list[Prompt],
        rendered: dict[int, list[RenderedPrompt]],
        settings: GenerationSettings,
        cancel: threading.Event | None = None,
    ) -> Iterator[StreamChunk]:
        with self._occupied():
            weights = self._prompt_weights(prompts)
            yield from decode(
                self.members,
                self.binding,
                rendered,
                settings,
                self.boundary,
                self.combining_device,
                cancel,
                weights,
                self._lanes,
            )

    def _prompt_weights(self, prompts: Sequence[Prompt]) -> list[tuple[float, ...]] | None:
        """Per prompt, the method's member weights under the "prompt" rule (`methods.weighting`):
        every participant scores the prompt's text; None when the method's weights are fixed."""
        if self.binding.rule is not WeightRule.PROMPT:
            return None
        texts = [prompt_text(p) for p in prompts]
        per_member = self._lanes.each(
            self.binding.participants, lambda m: self.members[m].text_logprob(texts, max_bytes=PROMPT_BYTES)
        )
        found = []
        for index in range(len(prompts)):
            shares = prompt_weights([per_member[m][index].per_byte for m in self.binding.participants])
            weights = [0.0] * len(self.members)
            for m, share in zip(self.binding.participants, shares, strict=True):
                weights[m] = share
            found.append(tuple(weights))
        return found

    def _collect(
        self, prompts: list[Prompt], settings: GenerationSettings, tools: Tools, reply_prefix: str
    ) -> list[GenerationResult]:
        rendered = self._render(prompts, settings, tools, reply_prefix)
        results: list[GenerationResult | None] = [None] * len(prompts)
        for chunk in self._locked_stream(prompts, rendered, settings):
            if chunk.result is not None:
                results[chunk.index] = chunk.result
        return [r for r in results if r is not None]

    def _render(
        self, prompts: list[Prompt], settings: GenerationSettings, tools: Tools, reply_prefix: str
    ) -> dict[int, list[RenderedPrompt]]:
        """Every participant's rendered prompts, with all input checks done before any forward."""
        self._check_open()
        for index, prompt in enumerate(prompts):
            validate_prompt(prompt, where=f"prompts[{index}]" if len(prompts) > 1 else "prompt")
        if not isinstance(reply_prefix, str):
            raise ConfigError(f"`reply_prefix` must be a string, but is {type(reply_prefix).__name__}.")
        check_text(reply_prefix, "reply_prefix")
        self.binding.method.check_constraint(settings.constraint)
        if settings.constraint is not None and reply_prefix:
            raise ConfigError(
                "`reply_prefix` and `constraint` do not combine: a constraint decides the reply from its first "
                "byte (a JSON constraint writes the opening brace itself). Drop `reply_prefix`."
            )
        checked_tools = validate_tools(tools)
        rendered: dict[int, list[RenderedPrompt]] = {}
        for m in self.binding.participants:
            member = self.members[m]
            rendered[m] = [member.render(p, checked_tools, reply_prefix) for p in prompts]
            for index, one in enumerate(rendered[m]):
                self._check_fits(member, one.ids, index, settings)
        return rendered

    @staticmethod
    def _check_fits(member: Member, ids: list[int], index: int, settings: GenerationSettings) -> None:
        if not ids:
            raise ConfigError(
                f"Prompt {index} renders to no tokens for member {member.name!r}; give a non-empty prompt."
            )
        window = member.context_window
        if window and len(ids) + settings.max_new_tokens > window:
            raise ConfigError(
                f"Prompt {index} has {len(ids)} tokens for member {member.name!r}; with max_new_tokens="
                f"{settings.max_new_tokens} that exceeds its context window of {window} tokens. "
                "Shorten the prompt or lower max_new_tokens."
            )
