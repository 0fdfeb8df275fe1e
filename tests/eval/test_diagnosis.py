"""Why a configuration lost: failure kinds read from real HumanEval runs, where a reply leaves
the best member's text, the report's tables, and scoring stored replies again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ensemble_core.errors import ConfigError
from ensemble_core.eval.config import ConfigurationSpec, EvalConfig, build_config
from ensemble_core.eval.diagnosis import (
    ASSERTION,
    BETWEEN_WORDS,
    DOES_NOT_PARSE,
    INSIDE_WORD,
    NO_ANSWER,
    ONE_ENDS,
    OTHER_OPTION,
    RUNTIME_ERROR,
    SAME_TEXT,
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
from ensemble_core.eval.tasks.base import Item, Task


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
        ("    assert False, 'expected a KeyError here'\n", ASSERTION),  # named by what was raised
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
    outcome = task.score(item, "    raise ValueError('x' * 600)\n")
    assert outcome.detail.startswith("failed: ") and len(outcome.detail) <= 310
    assert "\nValueError: xxx" in outcome.detail and "File" in outcome.detail  # the name, and where
    assert "ensemble-llm-sandbox" not in outcome.detail  # no temporary folder: the same on every run


def test_answer_tasks_fail_by_a_wrong_or_a_missing_answer_and_timeouts_by_their_status() -> None:
    assert failure_kind(record("c", "p", "", correct=True)) is None
    assert failure_kind(record("c", "p", "It is 7.", correct=False, extracted="7")) == WRONG_ANSWER
    assert failure_kind(record("c", "p", "I do not know.", correct=False)) == NO_ANSWER
    assert failure_kind(record("c", "p", "", correct=False, detail="timeout: ran past 10 s")) == TIMEOUT
    assert failure_kind(record("c", "p", "", correct=False, detail="failed: Exception")) == RUNTIME_ERROR
    syntax = "failed:   File \"program.py\", line 3\n    return (\nSyntaxError: '(' was never closed"
    assert failure_kind(record("c", "p", "", correct=False, detail=syntax)) == DOES_NOT_PARSE


def test_a_reply_leaves_the_reference_between_words_or_inside_one() -> None:
    choice = first_departure("    return any(x)\n", "    for i in range(n):\n", prompt_end='    """\n')
    assert (choice.offset, choice.place) == (4, BETWEEN_WORDS)
    assert (choice.mine, choice.theirs) == ("return any(x)\n", "for i in range(n):\n")
    split = first_departure("Geners are iterables", "Generators are iterables")
    assert (split.offset, split.place, split.before) == (5, INSIDE_WORD, "Gener")
    # A reply that differs from its first character is judged against the prompt's end.
    assert first_departure("o(x)", "rmat(x)", prompt_end="def f").place == INSIDE_WORD
    assert first_departure("o(x)", "rmat(x)", prompt_end="def f(").place == BETWEEN_WORDS
    # Punctuation after a shared word: a different choice, not a split word.
    assert first_departure("sum(x)", "sum.x", prompt_end="").place == BETWEEN_WORDS
    # A reply cut short is not a split word; the same reply scored differently says so.
    assert first_departure("    return su", "    return sum(x)\n").place == ONE_ENDS
    assert first_departure("    return x\n", "    return x\n").place == SAME_TEXT


def test_the_report_counts_failures_and_lists_each_problem_lost_to_the_best_member() -> None:
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
    assert [(lost.item, lost.failure, lost.departure.place) for lost in gac.losses] == [
        ("p0", RUNTIME_ERROR, BETWEEN_WORDS),
        ("p1", DOES_NOT_PARSE, INSIDE_WORD),
    ]

    from ensemble_core.eval.report import failure_table, render_losses

    table = "\n".join(failure_table(task_rows))
    # wrong, failed a test, raised, does not parse, where the losses leave the best member's text
    assert "| gac(a+b) | 2 | 0 | 1 | 1 | 1 between words, 1 inside a word |" in table
    losses = render_losses({"humaneval:raw": task_rows})
    assert "## humaneval:raw: gac(a+b) (against a alone)" in losses
    line = next(line for line in losses.splitlines() if line.startswith("| p1 "))
    # Newlines shown escaped and a pipe escaped: the table keeps its six cells.
    assert line.count(" | ") == 5 and "\\n" in line and "\\|" in line


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a ``b`` c", "``` a ``b`` c ```"),  # a fence longer than any backtick run inside
        ("    ", "`    `"),  # an all-space span keeps its spaces
        ("", "*(end)*"),
        ("x\ty\\n", "` x\\ty\\\\n `"),  # a tab and a literal backslash-n stay apart from a newline
    ],
)
def test_excerpts_stay_whole_in_a_table_cell(text: str, shown: str) -> None:
    from ensemble_core.eval.report import _code

    assert _code(text) == shown


def smol_alone_on(out: Path, task: dict) -> tuple:
    """A checked one-configuration evaluation (SmolLM2 alone) on `task`: config, its one
    configuration, the task and its problems."""
    config = build_config(
        {
            "members": {"smol": "smollm2-135m-instruct"},
            "output": str(out),
            "tasks": [task],
            "configurations": [{"members": ["smol"], "method": "single"}],
        }
    )
    [spec] = config.expanded()
    [(checked, items)] = config.selections
    return config, spec, checked, items


def stored_reply(
    config: EvalConfig, spec: ConfigurationSpec, task: Task, item: Item, reply: str, **changes: object
) -> Record:
    """A reply to `item` stored as wrong by `spec`, in a batch of two (`changes`: other fields)."""
    held = record(spec.label(), item.id, reply, correct=False, fingerprint=config.fingerprint(spec), task=task.key)
    return dataclasses.replace(held, prompt=item.prompt, answer=item.answer, batch_size=2, **changes)


def test_rescoring_updates_stored_scores_and_keeps_everything_measured(tmp_path: Path) -> None:
    config, spec, task, items = smol_alone_on(tmp_path, {"task": "humaneval", "style": "raw", "problems": 2})
    stale = [
        stored_reply(
            config,
            spec,
            task,
            item,
            item.answer if k == 0 else "    return None\n",
            detail="failed: (cut short)",
            tokens=9,
            batch_seconds=3.5,
            batch_tokens=18,
            member_seconds={"smol": 3.0},
        )
        for k, item in enumerate(items)
    ]
    RecordFile(tmp_path / RECORDS_FILE).append(stale)

    evaluation = Evaluation(config, quiet=True, loader=lambda alias, model: pytest.fail("rescoring loads no model"))
    done = evaluation.rescore()
    assert (done.rescored, done.now_correct, done.now_wrong, done.reworded, done.missing) == (2, 1, 0, 1, 0)
    fresh = {r.item: r for r in RecordFile(tmp_path / RECORDS_FILE)}
    assert fresh[items[0].id].correct and fresh[items[0].id].detail == "passed"
    assert not fresh[items[1].id].correct and "AssertionError" in fresh[items[1].id].detail
    assert all(
        dataclasses.replace(fresh[r.item], correct=r.correct, detail=r.detail) == r for r in stale
    )  # only the score changed
    lines = (tmp_path / RECORDS_FILE).read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["tokens"] == 9 for line in lines)
    again = Evaluation(config, quiet=True).rescore()  # a second pass finds nothing to change
    assert (again.now_correct, again.now_wrong, again.reworded) == (0, 0, 0)

    report = write_report(config, RecordFile(tmp_path / RECORDS_FILE), "ensemble-llm eval", plots=False)
    assert "1/2 = 50.0%" in report.read_text() and (tmp_path / "losses.md").exists()


def test_rescoring_option_choices_scores_the_stored_option_and_refuses_one_the_data_lacks(tmp_path: Path) -> None:
    config, spec, task, items = smol_alone_on(tmp_path, {"task": "arc_challenge", "style": "options", "problems": 2})
    chosen = [f" {items[0].answer}", next(o for o in items[1].options if o != f" {items[1].answer}")]  # " A"
    stored = [
        stored_reply(config, spec, task, item, choice, finish_reason=None, tokens=0, options=[0.25] * len(item.options))
        for item, choice in zip(items, chosen, strict=True)
    ]
    RecordFile(tmp_path / RECORDS_FILE).append(stored)
    done = Evaluation(config, quiet=True).rescore()
    assert (done.now_correct, done.now_wrong) == (1, 0)  # the right option was stored as wrong

    losses = summarise(RecordFile(tmp_path / RECORDS_FILE), {spec.label(): ("smol",)})
    assert all(lost.departure.place == OTHER_OPTION for row in losses[task.key] for lost in row.losses)

    odd = dataclasses.replace(stored[1], reply="(not an option)")
    (tmp_path / RECORDS_FILE).write_text(json.dumps(dataclasses.asdict(odd)) + "\n")
    with pytest.raises(ConfigError, match="is not one of the problem's options"):
        Evaluation(config, quiet=True).rescore()
