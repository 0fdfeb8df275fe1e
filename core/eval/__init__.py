"""Measuring whether an ensemble beats its members (`ensemble-llm eval` / `calibrate` as a Python API).

    from ensemble_core.eval import load_config, run_eval, write_report
    config = load_config("examples/eval-smoke.yaml")
    records = run_eval(config, quiet=True)          # resumable: records.jsonl under config.output
    print(write_report(config, records, "my script"))  # report.md (+ plots/)

A new task is one small class: subclass `Task`, decorate it with `@register_task("name")`
(see `ensemble_core.eval.tasks`). Names are imported on first use, so importing this package
(as the command line does) loads nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalConfig": "config",
    "TaskSpec": "config",
    "ConfigurationSpec": "config",
    "load_config": "config",
    "build_config": "config",
    "Evaluation": "runner",
    "run_eval": "runner",
    "write_report": "output",
    "Calibration": "calibrate",
    "write_calibrated": "calibrate",
    "Task": "tasks.base",
    "Item": "tasks.base",
    "Outcome": "tasks.base",
    "Plan": "tasks.base",
    "register_task": "tasks.base",
    "make_task": "tasks.base",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
