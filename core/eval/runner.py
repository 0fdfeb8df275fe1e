"""Running an evaluation: every configuration on every task, batched, resumable, with progress.

Members load once per evaluation (by alias) and are shared by every configuration that uses
them. For each configuration x task, the problems the record file does not hold yet run in
batches (`Ensemble.generate_batch`, or `Ensemble.option_probabilities` for style "options");
each batch's records are written as soon as it is scored, so Ctrl-C loses at most one batch and
the same command resumes.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ensemble_core.errors import ConfigError
from ensemble_core.eval.config import ConfigurationSpec, EvalConfig
from ensemble_core.eval.records import Record, RecordFile
from ensemble_core.eval.tasks import OPTIONS_STYLE, Item, Task
from ensemble_core.eval.tasks.base import Outcome

RECORDS_FILE = "records.jsonl"


@dataclass(frozen=True)
class Cell:
    """One configuration on one task: the problems it has to run."""

    spec: ConfigurationSpec
    name: str
    fingerprint: str
    task: Task
    items: list[Item]


class Evaluation:
    """An evaluation in progress (see the module docstring).

    Args:
        config: the checked configuration.
        quiet: no progress bars (CI); a line per finished cell instead.
        loader: builds a member from (alias, model); default `HFMember.from_pretrained` with the
            config's device and dtype (tests pass tiny models).
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        quiet: bool = False,
        loader: Callable[[str, str], object] | None = None,
    ):
        self.config = config
        self.quiet = quiet
        self.records = RecordFile(Path(config.output) / RECORDS_FILE)
        self._loader = loader or self._load_hf
        self._members: dict[str, object] = {}

    @property
    def path(self) -> Path:
        return self.records.path

    def cells(self) -> list[Cell]:
        """Every configuration x task, in config order (checks fingerprints against the file)."""
        selections = self.config.selections
        found = []
        for spec in self.config.expanded():
            name, fingerprint = spec.label(), self.config.fingerprint(spec)
            self.records.check_fingerprint(name, fingerprint)
            for task, items in selections:
                found.append(Cell(spec, name, fingerprint, task, items))
        return found

    def run(self) -> RecordFile:
        """Run what is missing; returns the record file (complete unless interrupted)."""
        for cell in self.cells():
            todo = [item for item in cell.items if not self.records.done(cell.name, cell.task.key, item.id)]
            if todo:
                self._run_cell(cell, todo)
        return self.records

    def rescore(self) -> Rescored:
        """Score this evaluation's replies on file (its configurations on its slices) again with
        their tasks' current scorers, after a scorer is fixed or learns a new symptom; nothing
        is generated again."""
        changed: list[Record] = []
        tally = Rescored()
        for cell in self.cells():
            for item in cell.items:
                held = self.records.records.get((cell.name, cell.task.key, item.id))
                if held is None:
                    tally.missing += 1
                    continue
                tally.rescored += 1
                if cell.task.style == OPTIONS_STYLE:
                    if held.reply not in item.options:
                        raise ConfigError(
                            f"{cell.name} | {cell.task.key} | {item.id}: the stored choice {held.reply!r} is not one "
                            f"of the problem's options {list(item.options)} (did the data change?); run it again "
                            "in a new output folder."
                        )
                    outcome = cell.task.score_choice(item, item.options.index(held.reply))
                else:
                    outcome = cell.task.score(item, held.reply)
                fresh = dataclasses.replace(
                    held,
                    correct=outcome.correct,
                    extracted=outcome.extracted,
                    detail=outcome.detail,
                    flags=list(outcome.flags),
                )
                if fresh.correct != held.correct:
                    tally.now_correct += fresh.correct
                    tally.now_wrong += not fresh.correct
                elif fresh != held:
                    tally.reworded += 1
                if fresh != held:
                    changed.append(fresh)
        self.records.replace(changed)
        return tally

    # ------------------------------------------------------------------ one cell

    def _run_cell(self, cell: Cell, todo: list[Item]) -> None:
        from ensemble_core import Ensemble

        members = [self._member(alias) for alias in cell.spec.members]
        ensemble = Ensemble(
            members, method=cell.spec.method, method_params=cell.spec.method_params(), boundary=cell.spec.boundary
        )
        progress = _Progress(f"{cell.name} | {cell.task.key}", len(todo), len(cell.items), self.quiet)
        batch_number = len(cell.items) - len(todo)
        size = self.config.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start : start + size]
            started = time.perf_counter()
            if cell.task.style == OPTIONS_STYLE:
                records = self._options(ensemble, cell, chunk, started, batch_number)
            else:
                records = self._generate(ensemble, cell, chunk, started, batch_number)
            self.records.append(records)
            batch_number += 1
            progress.advance(len(chunk), sum(r.correct for r in records))
        progress.close()

    def _generate(self, ensemble, cell: Cell, chunk: list[Item], started: float, batch: int) -> list[Record]:
        plan = cell.task.reply_plan()
        results = ensemble.generate_batch(
            [item.prompt for item in chunk],
            max_new_tokens=plan.max_new_tokens,
            stop=list(plan.stop),
            temperature=self.config.temperature,
            seed=self.config.seed,
        )
        seconds = time.perf_counter() - started
        tokens = sum(r.usage.completion_tokens for r in results)
        member_seconds: dict[str, float] = {}
        for result in results:  # session totals grow over the batch: the last to finish has them all
            for name, stats in result.stats.members.items():
                member_seconds[name] = max(member_seconds.get(name, 0.0), round(stats.forward_seconds, 3))
        records = []
        for item, result in zip(chunk, results, strict=True):
            outcome = cell.task.score(item, result.text)
            records.append(
                _record(
                    cell,
                    item,
                    outcome,
                    reply=result.text,
                    finish_reason=result.finish_reason,
                    tokens=result.usage.completion_tokens,
                    batch=batch,
                    batch_size=len(chunk),
                    batch_seconds=round(seconds, 3),
                    batch_tokens=tokens,
                    member_seconds=member_seconds,
                    share_ensembled=result.stats.method_stats.share_ensembled,
                    method_stats=result.stats.method_stats.as_dict(),
                    flags=list(outcome.flags),
                )
            )
        return records

    def _options(self, ensemble, cell: Cell, chunk: list[Item], started: float, batch: int) -> list[Record]:
        probabilities = ensemble.option_probabilities([i.prompt for i in chunk], [list(i.options) for i in chunk])
        seconds = time.perf_counter() - started
        records = []
        for item, probs in zip(chunk, probabilities, strict=True):
            choice = max(range(len(probs)), key=probs.__getitem__)
            outcome = cell.task.score_choice(item, choice)
            records.append(
                _record(
                    cell,
                    item,
                    outcome,
                    reply=item.options[choice],
                    finish_reason=None,
                    tokens=0,
                    batch=batch,
                    batch_size=len(chunk),
                    batch_seconds=round(seconds, 3),
                    batch_tokens=0,
                    options=[round(p, 6) for p in probs],
                )
            )
        return records

    # ------------------------------------------------------------------ members

    def _member(self, alias: str):
        if alias not in self._members:
            self._members[alias] = self._loader(alias, self.config.model_of(alias))
        return self._members[alias]

    def _load_hf(self, alias: str, model: str):
        from ensemble_core import HFMember

        return HFMember.from_pretrained(model, device=self.config.device, dtype=self.config.dtype, name=alias)


@dataclass
class Rescored:
    """What `Evaluation.rescore` did: replies scored again, how many changed their score
    (now correct / now wrong) or only their detail or flags, and problems with no reply yet."""

    rescored: int = 0
    now_correct: int = 0
    now_wrong: int = 0
    reworded: int = 0
    missing: int = 0

    def __str__(self) -> str:
        text = (
            f"rescored {self.rescored} replies: {self.now_correct} now correct, {self.now_wrong} now wrong, "
            f"{self.reworded} with a new detail or flags only"
        )
        if self.missing:
            text += f"; {self.missing} problems have no reply yet (run without --rescore to measure them)"
        return text


def _record(cell: Cell, item: Item, outcome: Outcome, **measured: Any) -> Record:
    """A problem's record: what identifies and scores it, plus what the run measured."""
    return Record(
        config=cell.name,
        fingerprint=cell.fingerprint,
        task=cell.task.key,
        item=item.id,
        correct=outcome.correct,
        extracted=outcome.extracted,
        detail=outcome.detail,
        prompt=_plain(item.prompt),
        answer=item.answer,
        **measured,
    )


def _plain(prompt) -> object:
    return prompt if isinstance(prompt, str) else [dict(m) for m in prompt]


class _Progress:
    """A progress bar with ETA per cell (tqdm, on stderr), or one line when it ends (quiet)."""

    def __init__(self, label: str, todo: int, total: int, quiet: bool):
        self.label, self.todo, self.total, self.quiet = label, todo, total, quiet
        self.done = self.correct = 0
        self.started = time.perf_counter()
        self._bar = None
        if not quiet:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=todo, desc=label, unit="problem", file=sys.stderr, dynamic_ncols=True)

    def advance(self, count: int, correct: int) -> None:
        self.done += count
        self.correct += correct
        if self._bar is not None:
            self._bar.update(count)
            self._bar.set_postfix_str(f"{self.correct}/{self.done} correct")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            seconds = time.perf_counter() - self.started
            sys.stderr.write(f"{self.label}: {self.correct}/{self.done} correct in {seconds:.0f} s\n")


def run_eval(config: EvalConfig, *, quiet: bool = False) -> RecordFile:
    """Run an evaluation (what the record file lacks) and return its records."""
    return Evaluation(config, quiet=quiet).run()
