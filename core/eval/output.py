"""Writing an evaluation's report: the markdown file and its plots, next to the records."""

from __future__ import annotations

from pathlib import Path

from ensemble_core.eval.config import EvalConfig
from ensemble_core.eval.plots import draw
from ensemble_core.eval.records import RecordFile
from ensemble_core.eval.report import REPORT_FILE, render, summarise


def write_report(config: EvalConfig, records: RecordFile, command: str, plots: bool = True) -> Path:
    """Summarise the records of `config`'s configurations and tasks into `<output>/report.md`
    (plots under `<output>/plots/`); returns the report's path."""
    out = Path(config.output)
    specs = config.expanded()
    members_of = {spec.label(): tuple(spec.members) for spec in specs}
    tasks = [task for task, _ in config.selections]
    boundary_of = {spec.label(): spec.boundary for spec in specs}
    wanted = config.record_keys()
    chosen = (r for r in records if r.key in wanted)
    rows = summarise(chosen, members_of, boundary_of)
    order = {label: index for index, label in enumerate(members_of)}
    ordered = {
        task.key: sorted(rows[task.key], key=lambda row: order[row.config]) for task in tasks if task.key in rows
    }
    figures = draw(ordered, out / "plots") if plots else {}
    path = out / REPORT_FILE
    path.write_text(render(ordered, {t.key: t.source for t in tasks}, figures, command, out), encoding="utf-8")
    return path
