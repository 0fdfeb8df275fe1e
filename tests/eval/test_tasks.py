"""Tasks: their data loads offline, problems are stable, answers are read and scored right."""

from __future__ import annotations

import pytest

from ensemble_core.errors import ConfigError, UnknownNameError
from ensemble_core.eval.tasks import TASKS, make_task
from ensemble_core.eval.tasks.answers import final_number, first_label, same_number
from ensemble_core.eval.tasks.arithmetic import generate
from ensemble_core.eval.tasks.base import select


@pytest.mark.parametrize(
    ("name", "style", "count", "first_id"),
    [
        ("humaneval", "raw", 164, "HumanEval/0"),
        ("gsm8k", "raw", 1319, "gsm8k/0"),
        ("arc_challenge", "options", 1172, "arc_challenge/Mercury_7175875"),
        ("arithmetic", "raw", 500, "arithmetic-seed0/0"),
    ],
)
def test_every_task_loads_its_shipped_data(name: str, style: str, count: int, first_id: str) -> None:
    items = make_task(name, style).items()
    assert len(items) == count
    assert items[0].id == first_id
    assert len({item.id for item in items}) == count  # ids key the records: they must be unique


def test_raw_prompts_are_few_shot_text_and_chat_prompts_are_messages() -> None:
    raw = make_task("gsm8k", "raw").items()[0]
    chat = make_task("gsm8k", "chat").items()[0]
    assert isinstance(raw.prompt, str) and raw.prompt.count("Question:") == 9 and raw.prompt.endswith("Answer:")
    assert chat.prompt[0]["role"] == "user" and "Janet" in chat.prompt[0]["content"]
    assert raw.answer == chat.answer == "18"


def test_arithmetic_problems_depend_only_on_the_seed_and_have_exact_answers() -> None:
    assert generate(0, 50) == generate(0, 50)
    assert generate(0, 50) != generate(1, 50)
    for problem in generate(3, 200):
        *_, last = problem.steps.rstrip(".").split(" = ")
        assert int(last) == problem.answer and problem.answer >= 0


def test_the_few_shot_examples_are_the_same_for_every_seed() -> None:
    def shots(seed: int) -> str:
        prompt = make_task("arithmetic", "raw", seed=seed).items()[0].prompt
        return prompt[: prompt.rindex("Question:")]

    assert shots(0) == shots(5) and shots(0).count("So the answer is") == 4


@pytest.mark.parametrize(
    ("reply", "number"),
    [
        (" 16 - 3 - 4 = 9. 9 * 2 = 18. So the answer is 18.", "18"),
        ("She makes $1,250 in all.", "1250"),
        ("#### 42", "42"),
        ("The answer is: -7", "-7"),
        ("First 3, then 5. The answer is 8. Check: 8 - 5 = 3", "8"),
        ("no digits here", None),
    ],
)
def test_the_final_number_is_the_stated_answer_else_the_last_number(reply: str, number: str | None) -> None:
    assert final_number(reply) == number


def test_numbers_compare_as_numbers() -> None:
    assert same_number("18.0", "18") and same_number("1250", "1,250")
    assert not same_number("17", "18") and not same_number(None, "18")


def test_option_letters_are_read_where_they_stand_alone() -> None:
    labels = ("A", "B", "C", "D")
    assert first_label(" C", labels) == "C"
    assert first_label("The answer is (B).", labels) == "B"  # "The" and "answer" are not labels
    assert first_label("I think so", labels) is None


def test_scores_of_each_task_use_its_own_reading() -> None:
    gsm = make_task("gsm8k", "raw")
    item = gsm.items()[0]
    assert gsm.score(item, " ... So the answer is 18.").correct
    assert not gsm.score(item, " ... So the answer is 19.").correct
    arc = make_task("arc_challenge", "options")
    question = arc.items()[0]
    assert arc.score_choice(question, 2).correct and not arc.score_choice(question, 0).correct
    assert arc.score(question, " C\n").correct and question.options == (" A", " B", " C", " D")


def test_humaneval_scores_by_running_the_tests_in_the_sandbox() -> None:
    task = make_task("humaneval", "raw")
    item = task.items()[2]  # truncate_number
    assert task.score(item, item.payload.canonical_solution).correct
    assert not task.score(item, "    return 0.5\n").correct


def test_slices_pick_problems_by_count_range_or_list() -> None:
    items = make_task("arithmetic", "raw").items()
    assert [i.id for i in select(items, 3)] == [i.id for i in items[:3]]
    assert [i.id for i in select(items, "2-4,9")] == [items[k].id for k in (2, 3, 4, 9)]
    with pytest.raises(ConfigError, match="outside 0-499"):
        select(items, "490-510")
    with pytest.raises(ConfigError, match="ranges like"):
        select(items, "first ten")
    with pytest.raises(ConfigError, match="asks for 501, but the task has 500"):
        select(items, 501)  # never silently fewer than asked for


def test_unknown_tasks_and_styles_are_named_errors() -> None:
    with pytest.raises(UnknownNameError, match="Known tasks: arc_challenge, arithmetic, gsm8k, humaneval"):
        make_task("gsm9k")
    with pytest.raises(ConfigError, match="no style 'chatty'"):
        make_task("humaneval", "chatty")
    with pytest.raises(ConfigError, match="does not take a `seed`"):
        make_task("gsm8k", seed=1)
    assert set(TASKS) >= {"humaneval", "gsm8k", "arc_challenge", "arithmetic"}
