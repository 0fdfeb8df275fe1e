"""The report's figures (matplotlib, extra `eval`): accuracy per configuration, and accuracy
against cost, so the trade-off reads at a glance. One pair of PNGs per task."""

from __future__ import annotations

from pathlib import Path

from ensemble_core.eval.config import file_safe
from ensemble_core.eval.report import Row
from ensemble_core.extras import require_extra


def _file_name(task: str, kind: str) -> str:
    return file_safe(task) + f"-{kind}.png"


def draw(rows_by_task: dict[str, list[Row]], folder: Path) -> dict[str, list[Path]]:
    """Write the PNGs under `folder`; returns their paths per task."""
    require_extra("matplotlib", "eval")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot

    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {}
    for task, rows in rows_by_task.items():
        written[task] = [_accuracy(pyplot, task, rows, folder)]
        if any(r.tokens for r in rows):
            written[task].append(_cost(pyplot, task, rows, folder))
    return written


def _accuracy(pyplot, task: str, rows: list[Row], folder: Path) -> Path:
    figure, axes = pyplot.subplots(figsize=(8, 0.42 * len(rows) + 1.4))
    names = [r.config for r in rows][::-1]
    values = [100 * r.accuracy for r in rows][::-1]
    below = [max(0.0, 100 * (r.accuracy - r.interval[0])) for r in rows][::-1]
    above = [max(0.0, 100 * (r.interval[1] - r.accuracy)) for r in rows][::-1]
    errors = [below, above]
    colours = ["#8da0cb" if r.alone else "#fc8d62" for r in rows][::-1]
    axes.barh(names, values, xerr=errors, color=colours, capsize=3)
    axes.set_xlabel("accuracy (%), 95% interval; blue: members alone")
    axes.set_xlim(0, 100)
    axes.set_title(task)
    figure.tight_layout()
    path = folder / _file_name(task, "accuracy")
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path


def _cost(pyplot, task: str, rows: list[Row], folder: Path) -> Path:
    figure, axes = pyplot.subplots(figsize=(8, 5))
    for row in rows:
        if row.ms_per_token is None:
            continue
        axes.scatter(row.ms_per_token, 100 * row.accuracy, color="#8da0cb" if row.alone else "#fc8d62", s=36)
        point = (row.ms_per_token, 100 * row.accuracy)
        axes.annotate(row.config, point, fontsize=7, xytext=(4, 3), textcoords="offset points")
    axes.set_xlabel("ms per reply token (batched, as run)")
    axes.set_ylabel("accuracy (%)")
    axes.set_title(f"{task}: accuracy against cost")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path = folder / _file_name(task, "cost")
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path
