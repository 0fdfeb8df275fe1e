"""`Ensemble`: members + a method -> `generate`, `stream`, `generate_batch`."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Unpack

from ensemble_core.chat import Prompt, validate_prompt
from ensemble_core.config import GenerationSettings, SettingsKwargs, build_settings
from ensemble_core.decode import decode
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.methods.base import Method, resolve_method
from ensemble_core.results import GenerationResult, StreamChunk


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
        **settings: Unpack[SettingsKwargs],
    ) -> GenerationResult:
        """Generate for one prompt: a `str` (raw completion) or a list of chat messages.

        Settings (all optional; see `GenerationSettings`): `max_new_tokens` (256), `stop`,
        `temperature` (0: greedy), `top_p` (1.0), `seed`. An unknown setting is a `ConfigError`.
        """
        return self._collect([prompt], build_settings(**settings))[0]

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        **settings: Unpack[SettingsKwargs],
    ) -> list[GenerationResult]:
        """Generate for many prompts at once (one batched forward per step); results in order."""
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ConfigError("`prompts` must be a list of prompts; for one prompt use `generate`.")
        if len(prompts) == 0:
            raise ConfigError("`prompts` is an empty list; give at least one prompt.")
        return self._collect(list(prompts), build_settings(**settings))

    def stream(
        self,
        prompt: Prompt,
        **settings: Unpack[SettingsKwargs],
    ) -> Iterator[StreamChunk]:
        """Yield text as it is committed; the last chunk carries `finish_reason` and `result`.

        Text that could still become a stop string is held back until it cannot.
        """
        checked = build_settings(**settings)
        prompt_ids = self._render([prompt], checked)
        return self._locked_stream(prompt_ids, checked)

    # ------------------------------------------------------------------ internals

    def _locked_stream(
        self, prompt_ids: dict[int, list[list[int]]], settings: GenerationSettings
    ) -> Iterator[StreamChunk]:
        with self._lock:
            yield from decode(self.members, self.method, prompt_ids, settings)

    def _collect(self, prompts: list[Prompt], settings: GenerationSettings) -> list[GenerationResult]:
        prompt_ids = self._render(prompts, settings)
        results: list[GenerationResult | None] = [None] * len(prompts)
        for chunk in self._locked_stream(prompt_ids, settings):
            if chunk.result is not None:
                results[chunk.index] = chunk.result
        return [r for r in results if r is not None]

    def _render(self, prompts: list[Prompt], settings: GenerationSettings) -> dict[int, list[list[int]]]:
        """Every participant's prompt ids, with all input checks done before any forward."""
        for index, prompt in enumerate(prompts):
            validate_prompt(prompt, where=f"prompts[{index}]" if len(prompts) > 1 else "prompt")
        rendered: dict[int, list[list[int]]] = {}
        for m in self.method.participants(self.members):
            member = self.members[m]
            rendered[m] = [member.render(p) for p in prompts]
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
