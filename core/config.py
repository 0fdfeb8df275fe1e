"""Validated generation settings: bad values fail here, with the field and the fix named."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError, field_validator

from ensemble_core.errors import ConfigError


class GenerationSettings(BaseModel):
    """What one `generate`/`stream`/`generate_batch` call asks for.

    Attributes:
        max_new_tokens: the most tokens to commit (counted as the method commits them:
            one per step for token-level methods).
        stop: strings that end generation when they appear in the text; matched on text
            across token boundaries and not included in the result.
        temperature: 0 means greedy; above 0, sample from softmax(logits / temperature).
        top_p: nucleus sampling: keep the smallest set of tokens whose mass reaches top_p.
        seed: makes sampling reproducible; each prompt gets its own generator seeded with
            it, so a prompt's text does not depend on what else is in the batch.
        constraint: what the reply must match (`ensemble_core.constraints`: JSONSchema,
            JSONObject, Regex, Choice, Grammar; docs/guides/constraints.md); None: free text.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: StrictInt = 256
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: StrictInt | None = None
    constraint: Any = None

    @field_validator("constraint")
    @classmethod
    def _a_constraint(cls, value: Any) -> Any:
        from ensemble_core.constraints import Constraint

        if value is not None and not isinstance(value, Constraint):
            raise ValueError(
                f"`constraint` has to be an `ensemble_core.constraints` constraint (JSONSchema, JSONObject, "
                f"Regex, Choice, Grammar), but is {type(value).__name__}"
            )
        if value is not None:
            value.grammar()  # checked now: an unsupported feature fails before any model runs
        return value

    @field_validator("max_new_tokens")
    @classmethod
    def _positive_tokens(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"`max_new_tokens` has to be a positive integer, but is {value}")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        try:
            items = [value] if isinstance(value, str) else list(value)
        except TypeError:
            raise ValueError(f"`stop` has to be a string or a list of strings, but is {value!r}") from None
        for item in items:
            if not isinstance(item, str) or not item:
                raise ValueError(f"`stop` must hold non-empty strings, but holds {item!r}")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"`stop` holds {item!r}, which is not valid Unicode (a lone surrogate)") from None
        return tuple(dict.fromkeys(items))

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float) -> float:
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"`temperature` has to be a finite number >= 0 (0 means greedy), but is {value}")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float) -> float:
        if not 0.0 < value <= 1.0:
            raise ValueError(f"`top_p` has to be in (0, 1], but is {value}")
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value < 2**64:
            raise ValueError(f"`seed` has to be an integer in [0, 2**64) or None, but is {value}")
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SettingsKwargs(TypedDict, total=False):
    """The keyword arguments `generate`, `stream` and `generate_batch` take (for type checkers)."""

    max_new_tokens: int
    stop: str | Sequence[str] | None
    temperature: float
    top_p: float
    seed: int | None
    constraint: Any


def build_settings(**values: Any) -> GenerationSettings:
    """`GenerationSettings(**values)`, with pydantic's report turned into one `ConfigError`."""
    try:
        return GenerationSettings(**values)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            field = ".".join(str(part) for part in item["loc"]) or "settings"
            message = item["msg"].removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                known = ", ".join(GenerationSettings.model_fields)
                message = f"`{field}` is not a generation setting; known settings: {known}"
            elif not message.startswith("`"):
                message = f"`{field}`: {message} (got {item.get('input')!r})"
            problems.append(message)
        raise ConfigError("; ".join(problems) + ".") from None
