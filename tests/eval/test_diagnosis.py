"""Why a configuration lost: failure kinds read from real HumanEval runs, where a reply leaves
the best member's text, the report's tables, and scoring stored replies again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ensemble_core.eval.config import build_config
from ensemble_core.eval.diagnosis import (
    ASSERTION,
    DOES_NOT_PARSE,
    NO_ANSWER,
    RUNTIME_ERROR,
    TIMEOUT,
    WRONG_ANSWER,
    failure_kind,
    first_departure,
)
from ensemble_core.eval.output import write_report
from ensemble_core.eval.records import Record, RecordFile
from ensemble_core.eval.report import summarise
from ensemble_core.eval.runner import RECORDS_FILE, Evaluation
from ensemble_core.eval.tasks import make_task


def record(config: str, item: str, reply: str, *, correct: bool, detail: str = "", **changes) -> Record:
    held = Record(
        config, "f", "humaneval:raw", item, correct, None, detail, "def f():\n", reply, "", "stop", 1, 0, 1, 1, 1
    )
    return dataclasses.replace(held, **changes)


@pytest.fixture(scope="module")
def humaneval():
    task = make_task("humaneval", "raw")
    return task, task.items()[0]  # has_close_elements(numbers, threshold)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("    return False\n", ASSERTION),  # runs, wrong value
        ("    return any(\n", DOES_NOT_PARSE),
        ("    return numbers.nearest(threshold)\n", RUNTIME_ERROR),  # AttributeError
        ("    raise ValueError('x' * 600)\n", RUNTIME_ERROR),  # a traceback longer than the detail keeps
        ("    return len(numbers) > 1 and min(abs(a - b) for a in numbers for b in numbers) < threshold\n", ASSERTION),
    ],
)
def test_a_wrong_code_reply_is_classed_by_what_stopped_its_tests(humaneval, reply: str, kind: str) -> None:
    task, item = humaneval
    outcome = task.score(item, reply)
    assert not outcome.correct
    assert len(outcome.detail) <= 310
    assert failure_kind(record("c", item.id, reply, correct=False, detail=outcome.detail)) == kind


def test_a_long_traceback_keeps_the_line_that_names_the_exception(humaneval) -> None:
    task, item = humaneval
    deep = "    def down(n):\n        return down(n + 1) + 1\n    return down(0)\n"  # RecursionError, long trace
    outcome = task.score(item, deep)
    assert "RecursionError" in outcome.detail and outcome.detail.startswith("failed: ")


def test_answer_tasks_fail_by_a_wrong_or_a_missing_answer_and_timeouts_by_their_status() -> None:
    assert failure_kind(record("c", "p", "", correct=True)) is None
    assert failure_kind(record("c", "p", "It is 7.", correct=False, extracted="7")) == WRONG_ANSWER
    assert failure_kind(record("c", "p", "I do not know.", correct=False)) == NO_ANSWER
    assert failure_kind(record("c", "p", "", correct=False, detail="timeout: ran past 10 s")) == TIMEOUT


def test_a_reply_leaves_the_reference_between_words_or_inside_one() -> None:
    choice = first_departure("    return any(x)\n", "    for i in range(n):\n", prompt_end='    """\n')
    assert (choice.offset, choice.inside_word) == (4, False)
    assert (choice.mine, choice.theirs) == ("return any(x)\n", "for i in range(n):\n")
    split = first_departure("Geners are iterables", "Generators are iterables")
    assert (split.offset, split.inside_word, split.before) == (5, True, "Gener")
    # A reply that differs from its first character is judged against the prompt's end.
    assert first_departure("o(x)", "rmat(x)", prompt_end="def f").inside_word
    assert not first_departure("o(x)", "rmat(x)", prompt_end="def f(").inside_word
    # Punctuation after a shared word: a different choice, not a split word.
    assert not first_departure("sum(x)", "sum.x", prompt_end="").inside_word


def test_the_report_counts_failures_and_lists_each_problem_lost_to_the_best_member(tmp_path: Path) -> None:
    rows = [
        record("a alone", "p0", "    return x\n", correct=True),
        record("a alone", "p1", "    return sorted(x)\n", correct=True),
        record("a alone", "p2", "    return 1\n", correct=False, detail="failed: AssertionError"),
        record("b alone", "p0", "    pass\n", correct=False, detail="failed: AssertionError"),
        record("b alone", "p1", "    pass\n", correct=False, detail="failed: AssertionError"),
        record("b alone", "p2", "    return 2\n", correct=True),
        record("gac(a+b)", "p0", "    return y\n", correct=False, detail="failed: NameError: name 'y'"),
        record("gac(a+b)", "p1", "    return sortedx|`\n", correct=False, detail="failed: SyntaxError"),
        record("gac(a+b)", "p2", "    return 2\n", correct=True),
    ]
    members = {"a alone": ("a",), "b alone": ("b",), "gac(a+b)": ("a", "b")}
    [task_rows] = summarise(rows, members).values()
    gac = next(row for row in task_rows if row.config == "gac(a+b)")
    assert gac.failures == {RUNTIME_ERROR: 1, DOES_NOT_PARSE: 1}
    assert [(lost.item, lost.failure, lost.departure.inside_word) for lost in gac.losses] == [
        ("p0", RUNTIME_ERROR, False),
        ("p1", DOES_NOT_PARSE, True),
    ]

    from ensemble_core.eval.report import failure_table, render_losses

    table = "\n".join(failure_table(task_rows))
    assert "| gac(a+b) | 2 | 0 | 1 | 1 | 1 / 1 |" in table  # wrong, failed a test, raised, does not parse
    losses = render_losses({"humaneval:raw": task_rows})
    assert "## humaneval:raw: gac(a+b) (against a alone)" in losses
    line = next(line for line in losses.splitlines() if line.startswith("| p1 "))
    # Newlines shown escaped and a pipe escaped: the table keeps its six cells.
    assert line.count(" | ") == 5 and "\\n" in line and "\\|" in line


def test_rescoring_updates_stored_scores_and_keeps_everything_measured(tmp_path: Path) -> None:
    config = build_config(
        {
            "members": {"smol": "smollm2-135m-instruct"},
            "output": str(tmp_path),
            "tasks": [{"task": "humaneval", "style": "raw", "problems": 2}],
            "configurations": [{"members": ["smol"], "method": "single"}],
        }
    )
    [spec] = config.expanded()
    [(task, items)] = config.selections
    stale = [
        Record(
            spec.label(),
            config.fingerprint(spec),
            task.key,
            item.id,
            False,
            None,
            "failed: (cut short)",
            item.prompt,
            item.answer if k == 0 else "    return None\n",
            item.answer,
            "stop",
            9,
            0,
            2,
            3.5,
            18,
            member_seconds={"smol": 3.0},
        )
        for k, item in enumerate(items)
    ]
    RecordFile(tmp_path / RECORDS_FILE).append(stale)

    evaluation = Evaluation(config, quiet=True, loader=lambda alias, model: pytest.fail("rescoring loads no model"))
    assert evaluation.rescore() == 2
    fresh = {r.item: r for r in RecordFile(tmp_path / RECORDS_FILE)}
    assert fresh[items[0].id].correct and fresh[items[0].id].detail == "passed"
    assert not fresh[items[1].id].correct and "AssertionError" in fresh[items[1].id].detail
    assert all(
        dataclasses.replace(fresh[r.item], correct=r.correct, detail=r.detail) == r for r in stale
    )  # only the score changed
    lines = (tmp_path / RECORDS_FILE).read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["tokens"] == 9 for line in lines)
    assert Evaluation(config, quiet=True).rescore() == 0  # a second pass finds nothing to change

    report = write_report(config, RecordFile(tmp_path / RECORDS_FILE), "ensemble-llm eval", plots=False)
    assert "1/2 = 50.0%" in report.read_text() and (tmp_path / "losses.md").exists()
