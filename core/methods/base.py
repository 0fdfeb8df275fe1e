"""The contract between the decode loop and a method, and the method registry.

A `Method` is immutable configuration (a frozen dataclass, checked when made). Bound to an
ensemble's members (`bind`), it becomes a `Binding`: which members take part, which one counts
the headline usage, the normalised weights, and any named roles (`drafter`, `primary`); an
unknown member name fails there, before any model work. For each generation the binding opens
a `MethodRun` that holds all of that generation's state, keyed by stable request ids, so one
method object can serve any number of ensembles and concurrent generations.

The `Ensemble` owns the loop: each step it asks the run for one `Commit` per active request,
applies stop strings and limits, commits the text to every member, and tells the run (through
`drop`, the one hook) which requests ended.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.errors import ConfigError, GenerationError, UnknownNameError
from ensemble_core.members.contract import Continuations, MemberSession, MemberVocab, RequestId
from ensemble_core.members.lanes import Lanes
from ensemble_core.methods.weighting import RULE_NAMES, WeightRule, rule_of
from ensemble_core.results import MethodStats
from ensemble_core.vocab.tokens import Scheme, TokenTable

T = TypeVar("T")


@dataclass(frozen=True)
class Commit:
    """What one step appends to one request.

    Attributes:
        text: the bytes appended to the committed text (may end inside a character).
        eos: the request ends after `text` (the end-of-sequence token itself appends nothing).
        tokens: how many tokens this commit counts toward `max_new_tokens` (the end-of-sequence
            token included, as `generate` counts it).
    """

    text: bytes = b""
    eos: bool = False
    tokens: int = 1


@dataclass
class DecodeState:
    """What a method run sees at each step.

    Attributes:
        members: every member's static facts (by member index).
        sessions: member index -> its session; only the members the method takes part with.
        settings: the call's generation settings.
        requests: the active requests, in order.
        generators: per request, its sampling generator (None when greedy).
        remaining: per request, how many tokens it may still commit; a multi-token commit
            must not exceed it.
        tails: per request, a function giving the last `n` committed bytes (stop strings).
        device: where distributions are combined (see `Ensemble`).
        weights: per request, member weights found before generating (the "prompt" rule);
            requests without an entry use the binding's weights.
    """

    members: Sequence[MemberVocab]
    sessions: dict[int, MemberSession]
    settings: GenerationSettings
    requests: list[RequestId]
    generators: dict[RequestId, torch.Generator | None]
    remaining: dict[RequestId, int] = field(default_factory=dict)
    tails: dict[RequestId, Callable[[int], bytes]] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    weights: dict[RequestId, tuple[float, ...]] = field(default_factory=dict)
    lanes: Lanes = field(default_factory=Lanes)
    member_generators: dict[tuple[RequestId, int], torch.Generator] = field(default_factory=dict)
    constraints: dict[RequestId, Any] = field(default_factory=dict)  # per request, its ConstraintState

    def each(self, members: Iterable[int], work: Callable[[int], T]) -> dict[int, T]:
        """`work(m)` for every member, members of different lanes concurrently (`members.lanes`).

        `work` may touch only member `m`'s session and its own locals; what it returns is
        combined afterwards in the calling thread.
        """
        return self.lanes.each(members, work)

    def next_of_each(
        self, members: Iterable[int], requests: Sequence[RequestId]
    ) -> dict[int, dict[RequestId, Continuations | None]]:
        """Several members' distributions for some requests (one forward each, concurrently)."""
        return self.each(members, lambda m: self.next_of(m, requests))

    def next_of(self, member: int, requests: Sequence[RequestId]) -> dict[RequestId, Continuations | None]:
        """One member's distributions for some requests (one forward)."""
        found = self.sessions[member].next(list(requests), _temperature(self.settings))
        return dict(zip(requests, found, strict=True))

    def member_generator(self, request: RequestId, member: int) -> torch.Generator | None:
        """A request's sampling stream for one member's own draws (None when greedy): seeded from
        the request's seed, so drafts sampled concurrently are as reproducible as sequential ones."""
        base = self.generators.get(request)
        if base is None:
            return None
        key = (request, member)
        if key not in self.member_generators:
            seed = (base.initial_seed() * 1_000_003 + member + 1) % (1 << 63)
            self.member_generators[key] = torch.Generator(device=base.device).manual_seed(seed)
        return self.member_generators[key]

    def forget(self, requests: Iterable[RequestId]) -> None:
        """Drop what the state holds for requests that ended."""
        ended = set(requests)
        for request in ended:
            self.generators.pop(request, None)
            self.tails.pop(request, None)
            self.weights.pop(request, None)
            self.constraints.pop(request, None)
        for key in [k for k in self.member_generators if k[0] in ended]:
            del self.member_generators[key]

    def tail(self, request: RequestId, size: int) -> bytes:
        return self.tails[request](size) if request in self.tails else b""


def _temperature(settings: GenerationSettings) -> float:
    return 1.0 if settings.greedy else settings.temperature


def require_some(distributions: Mapping[int, Continuations | None], request: RequestId) -> dict[int, Continuations]:
    """The members that can take part in this step; a `GenerationError` if none can."""
    found = {m: c for m, c in distributions.items() if c is not None}
    if not found:
        raise GenerationError(
            f"No member can continue request {request}: every member lacks tokens for the committed text "
            "(see the EnsembleWarning above). Add a member whose vocabulary covers it."
        )
    return found


class MethodRun(ABC):
    """One generation's worth of a method's state, keyed by request id."""

    @abstractmethod
    def step(self, state: DecodeState) -> dict[RequestId, Commit]:
        """One commit for each active request."""

    @abstractmethod
    def stats(self, request: RequestId) -> MethodStats:
        """The method's figures for one request (asked when it finishes, before `drop`)."""

    def drop(self, requests: Sequence[RequestId]) -> None:  # noqa: B027 - optional hook
        """These requests ended: forget their state."""

    def constrain(self, constraint: Any) -> Any:
        """A request's `ConstraintState` for `constraint` (methods that honour constraints)."""
        raise ConfigError(f"{type(self).__name__} cannot honour a constraint.")


@dataclass(frozen=True)
class Binding:
    """A method bound to an ensemble's members.

    Attributes:
        method: the configuration.
        members: every member's static facts.
        participants: indices of the members it runs (the others never load a prompt).
        reference: the member whose tokens count the headline usage.
        weights: one normalised weight per member (zeros for non-participants).
        roles: named members, e.g. {"drafter": 0}.
        rule: how per-request weights are found (`weighting.WeightRule`), or None: `weights`.
        cache: what a method builds once for these members and reuses in every run (the union
            vocabulary); it lives as long as the ensemble and is cleared by `Ensemble.close`.
    """

    method: Method
    members: tuple[MemberVocab, ...]
    participants: tuple[int, ...]
    reference: int
    weights: tuple[float, ...]
    roles: Mapping[str, int] = field(default_factory=dict)
    rule: WeightRule | None = None
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def start(self, settings: GenerationSettings, device: torch.device) -> MethodRun:
        """A fresh run for one generation."""
        return self.method.start(self, settings, device)


class Method(ABC):
    """A decoding strategy over members: immutable configuration, checked when made."""

    name: ClassVar[str]
    finds_weights: ClassVar[bool] = False
    """Whether `weights` may be a rule ("auto", "prompt", "agreement") found per request; the
    front ends then default to "auto" (`loading.front_end_params`)."""
    constraint_refusal: ClassVar[str | None] = "it has no rule for constrained text yet"
    """Why the method cannot honour a constraint (None: it can; docs/guides/constraints.md)."""

    def check_constraint(self, constraint: Any) -> None:
        """Raise `ConfigError` when a constraint is asked of a method that cannot honour it."""
        if constraint is not None and self.constraint_refusal is not None:
            raise ConfigError(
                f"{type(self).__name__} cannot honour a constraint: {self.constraint_refusal}. Use GaC, UniTE, "
                "contrastive decoding, the gate (GaC with a threshold) or SAFE for constrained replies."
            )

    @abstractmethod
    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        """Resolve member references and weights against an ensemble's members (raise on unknown
        names). Reads nothing of a member but its name: `check_members` binds members known by
        name only, before any model loads."""

    @abstractmethod
    def start(self, binding: Binding, settings: GenerationSettings, device: torch.device) -> MethodRun:
        """A fresh run for one generation."""

    def check_member_count(self, count: int) -> None:  # noqa: B027 - most methods take any number
        """Raise `ConfigError` when the method cannot run with `count` members (a method that
        limits the count calls it from its `bind`)."""

    def check_members(self, names: Sequence[str]) -> None:
        """Raise `ConfigError` when the method cannot bind to members called `names`: their count,
        the members its roles name (a drafter, a primary, an expert), one weight each. The config
        checks call it before any model loads (a YAML row, `ChatEnsemble(models=...)`, `serve`,
        `run`), so a typo in a role fails in a second, not after loading or, in an evaluation,
        after the cells before it have run. Binding reads nothing but the names, so the check is
        `bind` itself, on members known by name only."""
        self.bind([_known_by_name(name) for name in names])

    def combine_options(
        self, binding: Binding, shares: Mapping[int, torch.Tensor], weights: Sequence[float]
    ) -> torch.Tensor:
        """One prompt's probability of each of its options (`Ensemble.option_probabilities`), from
        each member's own probabilities normalised over the options: their weighted average."""
        total = torch.zeros_like(next(iter(shares.values())))
        for member, share in shares.items():
            total += weights[member] * share
        return total


def check_weights(weights: Sequence[float] | str | None) -> tuple[float, ...] | WeightRule | None:
    """Weights as floats (rejected when negative or all zero; their count is checked at bind),
    or a rule that finds them (`"auto"`, `"prompt"`, `"agreement"`: see `methods.weighting`)."""
    if weights is None or isinstance(weights, WeightRule):
        return weights
    if weights == "equal":  # said explicitly, e.g. to keep the papers' setting where "auto" is the default
        return None
    if isinstance(weights, str):
        if weights not in RULE_NAMES:
            raise ConfigError(
                f"`weights` must be numbers (one per member), 'equal' or one of {list(RULE_NAMES)}, but is {weights!r}."
            )
        return rule_of(weights)
    if isinstance(weights, bytes) or not isinstance(weights, Sequence):
        raise ConfigError(f"`weights` must be a list of numbers, one per member, but is {weights!r}.")
    try:
        values = tuple(float(w) for w in weights)
    except (TypeError, ValueError):
        raise ConfigError(f"`weights` must be a list of numbers, one per member, but is {weights!r}.") from None
    if any(not w >= 0.0 for w in values):
        raise ConfigError(f"`weights` must all be >= 0, but are {list(values)}.")
    if sum(values) <= 0.0:
        raise ConfigError(f"`weights` must not all be zero, but are {list(values)}.")
    return values


def numeric_weights(weights: Sequence[float] | str | None, method: str, instead: str = "") -> tuple[float, ...] | None:
    """`check_weights` for a method that takes numbers only: the rules that find weights read
    token distributions, which span and segment methods do not combine."""
    checked = check_weights(weights)
    if isinstance(checked, WeightRule):
        raise ConfigError(
            f"`weights={checked.value!r}` is for the token-level methods (GaC, UniTE, SAFE); {method} takes "
            f"numbers, one per member{instead}."
        )
    return checked


def normalised_weights(weights: Sequence[float] | WeightRule | None, count: int) -> tuple[float, ...]:
    """Weights for `count` members, summing to 1 (default, and the start of a rule: equal)."""
    if weights is None or isinstance(weights, WeightRule):
        return tuple([1.0 / count] * count)
    if len(weights) != count:
        raise ConfigError(f"`weights` has {len(weights)} entries, but the ensemble has {count} members.")
    total = sum(weights)
    return tuple(w / total for w in weights)


def check_positive_int(value: Any, field_name: str) -> int:
    """An integer >= 1, or a `ConfigError` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"`{field_name}` has to be a positive integer, but is {value!r}.")
    return value


def check_flag(value: Any, field_name: str) -> bool:
    """True or False, or a `ConfigError` naming the field (the string "false" is truthy: taken
    as a flag, a YAML or JSON typo would silently mean the opposite)."""
    if not isinstance(value, bool):
        raise ConfigError(f"`{field_name}` has to be true or false, but is {value!r}.")
    return value


def check_fraction(value: Any, field_name: str, low: float, high: float, *, low_open: bool, high_open: bool) -> float:
    """A number in the stated interval, or a `ConfigError` naming the field and the interval."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    above = number > low if low_open else number >= low
    below = number < high if high_open else number <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f"`{field_name}` has to be in {interval}, but is {value!r}.")
    return number


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
            raise ConfigError("`method_params` only apply when `method` is given by name.")
        return method
    if not isinstance(method, str) or method.lower() not in METHODS:
        known = ", ".join(sorted(METHODS))
        raise UnknownNameError(f"Unknown method {method!r}. Known methods: {known}.")
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"`method_params` must be a mapping of parameter names to values, but is {params!r}.")
    try:
        return METHODS[method.lower()](**dict(params or {}))
    except TypeError as error:  # an unknown or missing keyword of the method's __init__
        raise ConfigError(f"`method_params` do not fit method {method!r}: {error}") from None


def member_index(members: Sequence[MemberVocab], name: str, role: str) -> int:
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


def bind_all(
    method: Method,
    members: Sequence[MemberVocab],
    weights: Sequence[float] | WeightRule | None,
    reference: int = 0,
    roles: Mapping[str, int] | None = None,
) -> Binding:
    """A binding over every member (the usual case)."""
    return Binding(
        method=method,
        members=tuple(members),
        participants=tuple(range(len(members))),
        reference=reference,
        weights=normalised_weights(weights, len(members)),
        roles=dict(roles or {}),
        rule=weights if isinstance(weights, WeightRule) else None,
    )


_NO_TOKENS = TokenTable([], [], Scheme.PLAIN, False, [None] * 256)


def _known_by_name(name: str) -> MemberVocab:
    """A member as `Method.check_members` binds it: its name and nothing else."""
    return MemberVocab(name, _NO_TOKENS, frozenset(), 0, torch.device("cpu"))


def role_index(members: Sequence[MemberVocab], name: str | None, role: str) -> int:
    """A named role's member (the first member when not named)."""
    return 0 if name is None else member_index(members, name, role)
