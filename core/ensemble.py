"""`Ensemble`: members + a method -> `generate`, `stream`, `generate_batch`."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Unpack

import torch

from ensemble_core.aio import agenerate, astream
from ensemble_core.chat import Prompt, Tools, validate_prompt, validate_tools
from ensemble_core.config import GenerationSettings, SettingsKwargs, build_settings
from ensemble_core.decode import decode
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.methods.base import Method, resolve_method
from ensemble_core.results import GenerationResult, StreamChunk
from ensemble_core.tool_calls import forced_call_prefix


class Ensemble:
    """Several members writing one answer together, under one decoding method.

    Args:
        members: loaded members (e.g. `HFMember.from_pretrained(...)`); names must be unique.
        method: a `Method` instance or a registry name ("single", ...).
        method_params: parameters for a method given by name.

    Example:
        >>> qwen = HFMember.from_pretrained("qwen2.5-coder-0.5b-instruct")  # doctest: +SKIP
        >>> ens = Ensemble([qwen], method="single")  # doctest: +SKIP
        >>> ens.generate([{"role": "user", "content": "Hi"}], max_new_tokens=16).text  # doctest: +SKIP
    """

    def __init__(
        self,
        members: Sequence[Member],
        method: Method | str = "single",
        method_params: Mapping[str, Any] | None = None,
    ):
        members = list(members) if not isinstance(members, Member) else [members]
        if not members:
            raise ConfigError("`members` is empty; an ensemble needs at least one member.")
        for index, member in enumerate(members):
            if not isinstance(member, Member):
                raise ConfigError(
                    f"`members[{index}]` must be a Member (e.g. HFMember.from_pretrained(...)), "
                    f"but is {type(member).__name__}."
                )
        names = [m.name for m in members]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"Member names must be unique, but {duplicates} appear more than once; "
                "give each member its own `name=` when loading it."
            )
        self.members = members
        self.method = resolve_method(method, method_params)
        self.method.bind(self.members)
        # Members own stateful models; one generation runs at a time per ensemble.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Ensemble(members={[m.name for m in self.members]}, method={self.method!r})"

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
                (or as a tools section where a template has none; see `conversation`).
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
        prompt_ids = self._render([prompt], checked, tools, reply_prefix)
        return self._locked_stream(prompt_ids, checked, cancel)

    async def agenerate(
        self, prompt: Prompt, *, tools: Tools = None, reply_prefix: str = "", **settings: Unpack[SettingsKwargs]
    ) -> GenerationResult:
        """`generate` for asyncio: the work runs in a worker thread; cancelling the task stops it."""
        return await agenerate(self, prompt, tools=tools, reply_prefix=reply_prefix, **settings)

    def astream(
        self,
        prompt: Prompt,
        *,
        tools: Tools = None,
        reply_prefix: str = "",
        cancel: threading.Event | None = None,
        **settings: Unpack[SettingsKwargs],
    ) -> AsyncIterator[StreamChunk]:
        """`stream` for asyncio: never blocks the event loop; closing or cancelling it stops generation."""
        return astream(self, prompt, tools=tools, reply_prefix=reply_prefix, cancel=cancel, **settings)

    def pick_tool(self, prompt: Prompt, tools: Tools) -> str:
        """The tool the ensemble finds likeliest to call next, when a call is required.

        Each participant scores every tool's name as the continuation of the forced call
        opening (`... "name": "` + name + `"`, in its own tokens, one forward for all names);
        the names' probabilities are normalised per member and averaged. A small model asked
        to write the name itself may invent one; this choice is always a real tool.
        """
        checked = validate_tools(tools)
        if not checked:
            raise ConfigError("`pick_tool` needs at least one tool.")
        names = [t["function"]["name"] for t in checked]
        if len(names) == 1:
            return names[0]
        opening = forced_call_prefix(checked, "any")
        prompt_ids = self._render([prompt], build_settings(max_new_tokens=1), checked, opening)
        options = [json.dumps(name, ensure_ascii=False)[1:] for name in names]  # each name with its closing quote
        shares = torch.zeros(len(names))
        with self._lock:
            for m, [ids] in prompt_ids.items():
                member = self.members[m]
                session = member.start([ids])
                session.batch.forward_pending()
                continuations = [member.tokenizer.encode(o, add_special_tokens=False) for o in options]
                logprobs = torch.stack([s.sum() for s in session.batch.score(0, continuations)])
                shares += torch.softmax(logprobs.float().cpu(), dim=0)
        return names[int(shares.argmax())]

    @property
    def context_window(self) -> int:
        """Tokens the smallest member can hold (0: no member states a limit)."""
        windows = [m.context_window for m in self.members if m.context_window]
        return min(windows, default=0)

    @property
    def model_name(self) -> str:
        """A readable identifier for tracing: the method and the members, e.g. `safe(qwen+smol)`."""
        return f"{self.method.name}({'+'.join(m.name for m in self.members)})"

    # ------------------------------------------------------------------ internals

    def _locked_stream(
        self,
        prompt_ids: dict[int, list[list[int]]],
        settings: GenerationSettings,
        cancel: threading.Event | None = None,
    ) -> Iterator[StreamChunk]:
        with self._lock:
            yield from decode(self.members, self.method, prompt_ids, settings, cancel)

    def _collect(
        self, prompts: list[Prompt], settings: GenerationSettings, tools: Tools, reply_prefix: str
    ) -> list[GenerationResult]:
        prompt_ids = self._render(prompts, settings, tools, reply_prefix)
        results: list[GenerationResult | None] = [None] * len(prompts)
        for chunk in self._locked_stream(prompt_ids, settings):
            if chunk.result is not None:
                results[chunk.index] = chunk.result
        return [r for r in results if r is not None]

    def _render(
        self, prompts: list[Prompt], settings: GenerationSettings, tools: Tools, reply_prefix: str
    ) -> dict[int, list[list[int]]]:
        """Every participant's prompt ids, with all input checks done before any forward."""
        for index, prompt in enumerate(prompts):
            validate_prompt(prompt, where=f"prompts[{index}]" if len(prompts) > 1 else "prompt")
        if not isinstance(reply_prefix, str):
            raise ConfigError(f"`reply_prefix` must be a string, but is {type(reply_prefix).__name__}.")
        tools = validate_tools(tools)
        rendered: dict[int, list[list[int]]] = {}
        for m in self.method.participants(self.members):
            member = self.members[m]
            rendered[m] = [member.render(p, tools, reply_prefix) for p in prompts]
            for index, ids in enumerate(rendered[m]):
                self._check_fits(member, ids, index, settings)
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
