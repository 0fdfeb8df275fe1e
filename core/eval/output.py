"""Writing an evaluation's report: the markdown file and its plots, next to the records."""

from __future__ import annotations

from pathlib import Path

from ensemble_core.eval.config import EvalConfig
from ensemble_core.eval.plots import draw
from ensemble_core.eval.records import RecordFile
from ensemble_core.eval.report import LOSSES_FILE, REPORT_FILE, Row, render, render_losses, summarise


def write_report(config: EvalConfig, records: RecordFile, command: str, plots: bool = True) -> Path:
    """Summarise the records of `config`'s configurations and tasks into `<output>/report.md`
    (plots under `<output>/plots/`, lost problems in `<output>/losses.md`); returns the report's
    path."""
    out = Path(config.output)
    tasks = [task for task, _ in config.selections]
    ordered = summarised(config, records)
    figures = draw(ordered, out / "plots") if plots else {}
    (out / LOSSES_FILE).write_text(render_losses(ordered), encoding="utf-8")
    path = out / REPORT_FILE
    path.write_text(render(ordered, {t.key: t.source for t in tasks}, figures, command, out), encoding="utf-8")
    return path


def summarised(config: EvalConfig, records: RecordFile) -> dict[str, list[Row]]:
    """The report's rows per task key: `config`'s configurations on its slices, in its order."""
    specs = config.expanded()
    members_of = {spec.label(): tuple(spec.members) for spec in specs}
    boundary_of = {spec.label(): spec.boundary for spec in specs}
    wanted = config.record_keys()
    rows = summarise((r for r in records if r.key in wanted), members_of, boundary_of)
    order = {label: index for index, label in enumerate(members_of)}
    return {
        task.key: sorted(rows[task.key], key=lambda row: order[row.config])
        for task, _ in config.selections
        if task.key in rows
    }
