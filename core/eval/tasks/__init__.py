"""Benchmark tasks for `ensemble-llm eval`; importing this package registers the built-in ones."""

from ensemble_core.eval.tasks import arc, arithmetic, gsm8k, humaneval  # noqa: F401 - registers them
from ensemble_core.eval.tasks.base import OPTIONS_STYLE, TASKS, Item, Outcome, Plan, Task, make_task, register_task

__all__ = ["OPTIONS_STYLE", "TASKS", "Item", "Outcome", "Plan", "Task", "make_task", "register_task"]
