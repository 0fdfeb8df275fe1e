"""`ensemble-llm calibrate`: pick a configuration's weights, gate threshold, SAFE drafter or
SweetSpan's self-scores on a HELD-OUT slice of a task, and write the choice into a YAML config.

The visible slices are where results are reported, so they must not choose the settings: the
calibration slice must not overlap the slice the config evaluates on that task (checked). The
search is coordinate-wise and small: first the method's role setting (SAFE's drafter, the
gate's threshold) at the configuration's weights, then the weights (equal, the two rules of
`methods.weighting` for the token-level methods, and each member leading at 0.5 / 0.7 / 0.9)
at the best role setting (`--weights` limits that stage to some of them when a full search does
not fit the time: a GaC trio takes 6-9 minutes per candidate on 50 GSM8K problems on 2 cores).
SweetSpan's role setting (whether members' scores of their own spans
count) interacts with its weights, so there every pair of the two is tried.
The winner has the highest accuracy on the slice; ties go to the cheaper candidate (ms per
token), then to the earlier (simpler) one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ensemble_core.errors import ConfigError
from ensemble_core.eval.config import ConfigurationSpec, EvalConfig, TaskSpec, build_config
from ensemble_core.eval.report import Row, summarise
from ensemble_core.eval.runner import Evaluation

GATE_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
LEADS = (0.5, 0.7, 0.9)
TOKEN_METHODS = ("gac", "unite", "safe")
CALIBRATED_METHODS = (*TOKEN_METHODS, "sweetspan")
JOINT_METHODS = ("sweetspan",)
"""Whose role setting is searched together with the weights: SweetSpan's weights cannot lift a
strong member's own span while self-scores are dropped, so at equal weights keeping them looks
worse than it can be."""


def weight_options(members: list[str], rules: bool) -> dict[str, Any]:
    """Every weighting the search tries, by the name `--weights` picks it with: 'equal', the
    rules ('prompt', 'agreement') where the method reads token distributions, and
    'MEMBER:LEAD' (that member at LEAD, the rest sharing what is left)."""
    options: dict[str, Any] = {"equal": None}
    if rules:
        options.update(prompt="prompt", agreement="agreement")
    if len(members) < 2:
        return options
    for leader, alias in enumerate(members):
        for lead in LEADS:
            rest = round((1.0 - lead) / (len(members) - 1), 4)
            options[f"{alias}:{lead}"] = [lead if i == leader else rest for i in range(len(members))]
    return options


def _role_options(spec: ConfigurationSpec) -> list[dict[str, Any]]:
    if spec.method == "safe":
        return [{**spec.params, "drafter": member} for member in spec.members]
    if spec.method == "gac" and spec.params.get("threshold") is not None:
        return [{**spec.params, "threshold": t} for t in GATE_THRESHOLDS]
    if spec.method == "sweetspan":
        return [{**spec.params, "self_score": keep} for keep in (False, True)]
    return [dict(spec.params)]


def _overlaps(config: EvalConfig, task: TaskSpec) -> bool:
    """Whether the calibration slice shares problems with an evaluated slice (in any style: the
    problems are the same)."""
    held_out = {item.id for item in task.selection()[1]}
    evaluated = (
        items for spec, (_, items) in zip(config.tasks, config.selections, strict=True) if spec.task == task.task
    )
    return any(held_out & {item.id for item in items} for items in evaluated)


class Calibration:
    """One calibration run (see the module docstring)."""

    def __init__(
        self,
        config: EvalConfig,
        name: str,
        task: TaskSpec,
        out: Path,
        quiet: bool = False,
        loader: Callable[[str, str], object] | None = None,
        weights: Sequence[str] | None = None,
    ):
        found = [spec for spec in config.expanded() if spec.label() == name]
        if not found:
            known = ", ".join(repr(spec.label()) for spec in config.expanded())
            raise ConfigError(f"No configuration named {name!r} in the config; its configurations are {known}.")
        self.spec = found[0]
        if self.spec.method not in CALIBRATED_METHODS:
            raise ConfigError(
                f"Calibration picks weights, thresholds, drafters and self-scores of {list(CALIBRATED_METHODS)}; "
                f"{name!r} uses {self.spec.method!r}."
            )
        if _overlaps(config, task):
            raise ConfigError(
                f"The calibration slice of {task.task!r} overlaps the slice the config evaluates; pick problems "
                "outside it (e.g. --task gsm8k:raw@1000-1039), so reported results are not tuned on."
            )
        self.options = weight_options(self.spec.members, self.spec.method in TOKEN_METHODS)
        if weights is not None and not weights:
            raise ConfigError(f"--weights names no weighting; pick from {list(self.options)} or leave it out.")
        unknown = [option for option in weights or () if option not in self.options]
        if unknown:
            raise ConfigError(
                f"--weights names weightings the search does not have: {unknown}; pick from {list(self.options)}."
            )
        # A subset keeps each candidate's name (and so its records) as in the full search, so a
        # later full calibration into the same folder reuses them.
        self.tried = set(weights or self.options)
        self.config, self.task, self.out, self.quiet, self.loader = config, task, out, quiet, loader

    def _evaluate(self, candidates: list[ConfigurationSpec], stage: str) -> list[Row]:
        data = self.config.model_dump(mode="json")
        data.update(
            tasks=[self.task.model_dump(mode="json")],
            configurations=[c.model_dump(mode="json") for c in candidates],
            output=str(self.out / stage),
        )
        config = build_config(data, where="the calibration")
        records = Evaluation(config, quiet=self.quiet, loader=self.loader).run()
        wanted = config.record_keys()  # the folder may hold this configuration's other slices
        rows = summarise((r for r in records if r.key in wanted), {c.label(): tuple(c.members) for c in candidates})
        [found] = rows.values()
        order = {c.label(): i for i, c in enumerate(candidates)}
        return sorted(found, key=lambda row: order[row.config])

    def run(self) -> tuple[ConfigurationSpec, list[Row]]:
        """The best candidate, and every candidate's row (both stages)."""
        roles = [
            self.spec.model_copy(update={"params": params, "name": f"role {k}: {_shown(params)}"})
            for k, params in enumerate(_role_options(self.spec))
        ]
        role_rows = []
        if self.spec.method in JOINT_METHODS:  # role and weights interact: every pair is tried
            kept = roles
        else:
            role_rows = self._evaluate(roles, "roles") if len(roles) > 1 else []
            kept = [roles[_best(role_rows)] if role_rows else roles[0]]
        weights = [
            role.model_copy(update={"weights": w, "name": f"weights {k}: {w or 'equal'}" + _role_suffix(role, kept)})
            for role in kept
            for k, (option, w) in enumerate(self.options.items())
            if option in self.tried
        ]
        weight_rows = self._evaluate(weights, "weights")
        chosen = weights[_best(weight_rows)]
        name = f"{self.spec.label()} calibrated"
        return chosen.model_copy(update={"name": name}), role_rows + weight_rows


def _role_suffix(role: ConfigurationSpec, kept: list[ConfigurationSpec]) -> str:
    return f", {_shown(role.params)}" if len(kept) > 1 else ""


def _shown(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) or "defaults"


def _best(rows: Iterable[Row]) -> int:
    listed = list(rows)
    return max(range(len(listed)), key=lambda i: (listed[i].accuracy, -(listed[i].ms_per_token or 0.0), -i))


def write_calibrated(source: Path, chosen: ConfigurationSpec, rows: list[Row], target: Path, task: TaskSpec) -> None:
    """`source`'s YAML with the calibrated configuration added after the one it calibrates."""
    import yaml

    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    entry = chosen.model_dump(mode="json", exclude_defaults=True)
    entry["name"] = chosen.name
    data["configurations"].append(entry)
    lines = [f"# calibrated on {task.task}:{task.style or ''}@{task.problems} by `ensemble-llm calibrate`:"]
    lines += [f"#   {row.config}: {row.correct}/{row.total}" for row in rows]
    target.write_text("\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
