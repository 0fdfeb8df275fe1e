"""The contract between the decode loop and a method, and the method registry.

A `Method` is configuration (checked in `__init__`), bound once to an ensemble's members.
For each generation it opens a `MethodRun` that holds that generation's state, so one
method object can serve concurrent generations. The `Ensemble` owns the loop: it asks the
run for one `Commit` per active row, applies stop strings and limits, and brings every
member's ids in step with the committed text.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError, UnknownNameError
from ensemble_core.members.base import Member
from ensemble_core.members.text_sync import MemberSession


@dataclass(frozen=True)
class Commit:
    """What one step appends to one row.

    Attributes:
        text: the bytes appended to the committed text (may end inside a character).
        eos: the row ends after `text` (the end-of-sequence token itself appends nothing).
        tokens: how many tokens this commit counts toward `max_new_tokens` (the end-of-
            sequence token included, as `generate` counts it).
        proposals: member index -> that member's own token ids spelling a prefix of `text`
            (usually all of it); such a member keeps its ids instead of re-encoding.
    """

    text: bytes = b""
    eos: bool = False
    tokens: int = 1
    proposals: Mapping[int, Sequence[int]] = field(default_factory=dict)


def token_commit(member: Member, member_index: int, token: int) -> Commit:
    """Commit one token a member chose itself: its bytes (it keeps its id), or the end."""
    if token in member.eos_token_ids:
        return Commit(eos=True)
    spelled = member.table.token_bytes[token] if token < len(member.table) else None
    return Commit(text=spelled or b"", proposals={member_index: [token]})


@dataclass
class DecodeState:
    """What a method run sees at each step.

    Attributes:
        members: all members of the ensemble (by index).
        remaining: per active row, how many tokens it may still commit (`max_new_tokens`
            minus what it has); a multi-token commit must not exceed it.
        sessions: member index -> its session; only the members the method takes part with.
            Session row k is the k-th active row.
        settings: the call's generation settings.
        generators: per active row, its sampling generator (None when greedy).
    """

    members: Sequence[Member]
    sessions: dict[int, MemberSession]
    settings: GenerationSettings
    generators: list[torch.Generator | None]
    remaining: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.generators)


def in_step_members(state: DecodeState, row: int, members: Sequence[int]) -> list[int]:
    """The members whose ids spell all of the row's committed text (a member that cannot
    spell a split character holds it back and sits the step out, unless all would)."""
    ready = [m for m in members if not state.sessions[m].held(row)]
    return ready or list(members)


class MethodRun(ABC):
    """One generation's worth of a method's state."""

    @abstractmethod
    def step(self, state: DecodeState) -> list[Commit]:
        """One commit for each active row, in row order."""

    def stats(self) -> dict[str, Any]:
        """Method-specific figures for the results (empty by default)."""
        return {}


class Method(ABC):
    """A decoding strategy over members. Subclasses check their arguments in `__init__`."""

    name: ClassVar[str]

    def bind(self, members: Sequence[Member]) -> None:  # noqa: B027 - optional hook
        """Resolve member references against the ensemble's members (raise on unknown names)."""

    @abstractmethod
    def participants(self, members: Sequence[Member]) -> list[int]:
        """Indices of the members this method runs (the others never load a prompt)."""

    @abstractmethod
    def reference_member(self, members: Sequence[Member]) -> int:
        """The member whose tokens count the headline usage."""

    @abstractmethod
    def start(self, members: Sequence[Member], settings: GenerationSettings) -> MethodRun:
        """A fresh run for one generation."""


class EnsembleMethod(Method):
    """A method over all members, with optional per-member weights (normalised when bound)."""

    def __init__(self, weights: Sequence[float] | None = None):
        self.weights = check_weights(weights)
        self._normalised: list[float] = []

    def bind(self, members: Sequence[Member]) -> None:
        self._normalised = normalised_weights(self.weights, len(members))

    @property
    def member_weights(self) -> list[float]:
        """The weights in use (summing to 1), known once the method is bound."""
        return self._normalised

    def participants(self, members: Sequence[Member]) -> list[int]:
        return list(range(len(members)))

    def reference_member(self, members: Sequence[Member]) -> int:
        return 0


def check_weights(weights: Sequence[float] | None) -> list[float] | None:
    """Weights as floats, rejected when negative or all zero (their count is checked at bind)."""
    if weights is None:
        return None
    if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
        raise ConfigError(f"`weights` must be a list of numbers, one per member, but is {weights!r}.")
    values = [float(w) for w in weights]
    if any(not w >= 0.0 for w in values):
        raise ConfigError(f"`weights` must all be >= 0, but are {values}.")
    if sum(values) <= 0.0:
        raise ConfigError(f"`weights` must not all be zero, but are {values}.")
    return values


def normalised_weights(weights: list[float] | None, count: int) -> list[float]:
    """Weights for `count` members, summing to 1 (default: equal)."""
    if weights is None:
        return [1.0 / count] * count
    if len(weights) != count:
        raise ConfigError(f"`weights` has {len(weights)} entries, but the ensemble has {count} members.")
    total = sum(weights)
    return [w / total for w in weights]


METHODS: dict[str, type[Method]] = {}
_M = TypeVar("_M", bound=type[Method])


def register(name: str) -> Callable[[_M], _M]:
    """Class decorator: make a method available as `Ensemble(..., method=name)`."""

    def add(cls: _M) -> _M:
        cls.name = name
        METHODS[name] = cls
        return cls

    return add


def resolve_method(method: Method | str, params: Mapping[str, Any] | None = None) -> Method:
    """A method instance from an instance or a registry name (with optional parameters)."""
    if isinstance(method, Method):
        if params:
            raise UnknownNameError("`method_params` only apply when `method` is given by name.")
        return method
    if not isinstance(method, str) or method.lower() not in METHODS:
        known = ", ".join(sorted(METHODS))
        raise UnknownNameError(f"Unknown method {method!r}. Known methods: {known}.")
    try:
        return METHODS[method.lower()](**dict(params or {}))
    except TypeError as error:  # an unknown or missing keyword of the method's __init__
        raise ConfigError(f"`method_params` do not fit method {method!r}: {error}") from None


def member_index(members: Sequence[Member], name: str, role: str) -> int:
    """The index of the member called `name` (or whose name it uniquely begins), else an error.

    `SAFE(drafter="qwen")` thus finds "qwen2.5-coder-0.5b-instruct".
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"`{role}` must be a member name, but is {name!r}.")
    exact = [i for i, m in enumerate(members) if m.name == name]
    starting = [i for i, m in enumerate(members) if m.name.lower().startswith(name.lower())]
    if exact or len(starting) == 1:
        return (exact or starting)[0]
    known = ", ".join(repr(m.name) for m in members)
    if starting:
        raise UnknownNameError(f"`{role}` is {name!r}, which matches several members ({known}); use a full name.")
    raise UnknownNameError(f"`{role}` is {name!r}, but the ensemble's members are {known}.")
