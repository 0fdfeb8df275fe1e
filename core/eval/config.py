"""What an evaluation runs: members, configurations (method, parameters, weights) and tasks.

Written as YAML (`ensemble-llm eval --config examples/eval.yaml`) or built from command-line
lists; either way it is checked completely (unknown keys, tasks, styles, members, methods and
method parameters) before any model loads.

    members:                     # aliases used below (these four are the defaults)
      qwen: qwen2.5-coder-0.5b-instruct
    tasks:
      - {task: humaneval, style: raw, problems: 0-39}
      - {task: arithmetic, seed: 0, problems: 50}
    configurations:
      - {members: [qwen, smol, gemma], method: single}        # each member alone
      - {members: [qwen, smol, gemma], method: gac, weights: auto}
      - {name: gate, members: [qwen, smol, gemma], method: gac, params: {threshold: 0.5, primary: qwen}}
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ensemble_core.errors import ConfigError, UnknownNameError
from ensemble_core.eval.tasks import Item, Task, make_task
from ensemble_core.eval.tasks.base import select
from ensemble_core.methods.base import resolve_method

DEFAULT_MEMBERS = {
    "qwen": "qwen2.5-coder-0.5b-instruct",
    "smol": "smollm2-135m-instruct",
    "gemma": "gemma-3-270m",
    "qwen15": "qwen2.5-coder-1.5b-instruct",
}
Weights = list[float] | Literal["auto", "prompt", "agreement"] | None


class TaskSpec(BaseModel):
    """One task of the matrix: its registry name, style, seed (generated tasks) and slice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str
    style: str | None = None
    seed: int | None = None
    problems: int | str | None = Field(default=None, description="N (the first N), 'A-B', or '0-9,20'")
    max_new_tokens: int | None = Field(default=None, ge=1, description="a lower reply budget than the task's")

    def build(self) -> Task:
        return make_task(self.task, self.style, self.seed, self.max_new_tokens)

    def selection(self) -> tuple[Task, list[Item]]:
        """The built task and the problems this spec's slice picks from it (a bad slice raises)."""
        task = self.build()
        return task, select(task.items(), self.problems)


class ConfigurationSpec(BaseModel):
    """One configuration: members (aliases), a method with its parameters, weights, boundary.

    `method: single` with several members stands for each member alone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    members: list[str] = Field(min_length=1)
    method: str = "single"
    params: dict[str, Any] = Field(default_factory=dict)
    weights: Weights = None
    boundary: Literal["correct", "retokenize"] = "correct"

    @field_validator("members")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"`members` lists a member twice: {value}")
        return value

    def method_params(self) -> dict[str, Any]:
        params = dict(self.params)
        if self.weights is not None:
            params["weights"] = self.weights
        return params

    def label(self) -> str:
        """A readable default name, e.g. "gac(qwen+smol+gemma) auto" or "qwen alone"."""
        if self.name:
            return self.name
        if self.method == "single":
            base = f"{self.members[0]} alone"
        else:
            shown = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
            base = f"{self.method}{'[' + shown + ']' if shown else ''}({'+'.join(self.members)})"
            if self.weights is not None:
                shown = self.weights if isinstance(self.weights, str) else ",".join(f"{w:g}" for w in self.weights)
                base += f" w={shown}"
        return base if self.boundary == "correct" else f"{base} [retokenize]"


class EvalConfig(BaseModel):
    """A whole evaluation (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    members: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_MEMBERS))
    tasks: list[TaskSpec] = Field(min_length=1)
    configurations: list[ConfigurationSpec] = Field(min_length=1)
    batch_size: int = Field(default=8, ge=1)
    device: str | None = None  # the first GPU, else the CPU: as `run` and `serve`
    dtype: str = "auto"  # the checkpoint's, as `run` and `serve`
    output: Path = Path("eval-results")
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int | None = None

    def expanded(self) -> list[ConfigurationSpec]:
        """Configurations with `single` over several members split into one per member (each once)."""
        found: dict[str, ConfigurationSpec] = {}
        for spec in self.configurations:
            pieces = [spec]
            if spec.method == "single" and len(spec.members) > 1:
                pieces = [spec.model_copy(update={"members": [m], "name": None}) for m in spec.members]
            for piece in pieces:
                found.setdefault(piece.label(), piece)
        return list(found.values())

    @cached_property
    def selections(self) -> list[tuple[Task, list[Item]]]:
        """Each task spec's built task and selected problems, in config order (a bad slice raises).
        Built once per config: building a task reads its data, and the check, the runner's cells
        and the report all need them; the config is frozen, so they cannot go stale."""
        return [spec.selection() for spec in self.tasks]

    def record_keys(self) -> set[tuple[str, str, str]]:
        """The (configuration, task, problem) keys this evaluation asks for. A record file can
        hold more (an earlier, wider slice; a calibration of the same configuration on another
        task or slice); a summary must count only these, or it mixes problems it was not given."""
        labels = [config.label() for config in self.expanded()]
        return {(label, task.key, item.id) for task, items in self.selections for item in items for label in labels}

    def model_of(self, alias: str) -> str:
        """The model (packaged name, hub id or folder) a member alias stands for."""
        return self.members.get(alias, alias)

    def fingerprint(self, spec: ConfigurationSpec) -> str:
        """A short hash of everything that decides a configuration's text."""
        definition = {
            "members": [self.model_of(m) for m in spec.members],
            "method": spec.method,
            "params": spec.method_params(),
            "boundary": spec.boundary,
            "dtype": self.dtype,
            "temperature": self.temperature,
            "seed": self.seed,
        }
        return hashlib.sha256(json.dumps(definition, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def check(self) -> None:
        """Everything that can be checked without loading a model (raises `ConfigError`)."""
        self.selections  # noqa: B018 - built here, so a bad slice raises before any model loads
        for spec in self.expanded():
            for alias in spec.members:
                _check_member(alias, self.model_of(alias), self.members)
            resolve_method(spec.method, spec.method_params()).check_members(spec.members)  # named by alias


def file_safe(name: str) -> str:
    """A task or configuration name as a file or folder name (runs of other characters: `_`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _check_member(alias: str, model: str, aliases: dict[str, str]) -> None:
    from ensemble_core import packaged

    if model in packaged.packaged_names() or Path(model).exists() or "/" in model:
        return  # a packaged model, a local folder, or a Hub id (checked when it loads)
    known = ", ".join(f"{a} ({m})" for a, m in aliases.items())
    raise UnknownNameError(
        f"Unknown member {alias!r}: not an alias, a packaged model, a folder or a Hub id. Known aliases: {known}."
    )


def load_config(path: str | Path) -> EvalConfig:
    """Read and check a YAML evaluation config."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"No evaluation config at {path}; see examples/eval.yaml for one.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping (members, tasks, configurations), not {type(data).__name__}.")
    data.setdefault("output", f"eval-results/{path.stem}")
    return build_config(data, where=str(path))


def build_config(data: dict[str, Any], where: str = "the evaluation config") -> EvalConfig:
    """An `EvalConfig` from plain data, with pydantic's report turned into one `ConfigError`."""
    try:
        config = EvalConfig(**data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            location = ".".join(str(part) for part in item["loc"])
            if item["type"] == "extra_forbidden":
                problems.append(f"`{location}` is not a known key (a typo?)")
            else:
                problems.append(f"`{location}`: {item['msg']} (got {item.get('input')!r})")
        raise ConfigError(f"{where}: " + "; ".join(problems) + ".") from None
    config.check()
    return config
