"""Generated code runs in a separate, limited process: it cannot hang, exhaust memory, fork,
write outside its folder, read our environment, or reach the network."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ensemble_core.eval.sandbox import Limits, run_isolated
from ensemble_core.eval.tasks.humaneval import check, load_problems, program

QUICK = Limits(timeout=3.0, memory_mb=512)


def test_a_program_that_loops_is_killed_at_the_timeout() -> None:
    started = time.perf_counter()
    result = run_isolated("while True:\n    pass\n", QUICK)
    assert result.status == "timeout"
    assert time.perf_counter() - started < QUICK.timeout + 3


def test_a_program_that_allocates_without_bound_fails_instead_of_exhausting_memory() -> None:
    # The memory limit must stop it, not the clock: on a loaded machine, zero-filling 512 MB has
    # taken longer than QUICK's 3 s, so this test gives time and a smaller limit.
    limits = Limits(timeout=60.0, memory_mb=256)
    result = run_isolated("hoard = []\nwhile True:\n    hoard.append(bytearray(50 * 2**20))\n", limits)
    assert result.status == "failed" and "MemoryError" in result.detail


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.fork()",
        "import posix\nposix.fork()",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import multiprocessing",
        "import ctypes",
    ],
)
def test_a_program_cannot_start_processes(code: str) -> None:
    result = run_isolated(code, QUICK)
    assert result.status == "failed", code


def test_a_program_writes_only_inside_its_own_folder_which_then_disappears(tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    result = run_isolated(f"open({str(outside)!r}, 'w').write('x')\n", QUICK)
    assert result.status == "failed" and "blocked" in result.detail
    assert not outside.exists()
    inside = run_isolated("open('note.txt', 'w').write('x')\nimport os\nprint(os.getcwd())\n", QUICK)
    assert inside.passed
    big = run_isolated("open('big.bin', 'wb').write(b'x' * (64 * 2**20))\n", Limits(timeout=5.0, file_mb=8))
    assert big.status == "failed"  # the file size limit


def test_a_program_sees_none_of_our_environment(monkeypatch) -> None:
    monkeypatch.setenv("ENSEMBLE_LLM_SECRET", "hunter2")
    code = "import os\nassert 'ENSEMBLE_LLM_SECRET' not in os.environ, os.environ\nassert not os.environ.get('HOME')\n"
    assert run_isolated(code, QUICK).passed


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root; elsewhere the network stays")
def test_a_program_has_no_network_when_we_can_take_it_away() -> None:
    code = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n"
    result = run_isolated(code, QUICK)
    assert result.status == "failed" and "unreachable" in result.detail


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail() -> None:
    problems = load_problems()
    assert len(problems) == 164
    for problem in problems[:10]:
        assert check(problem, problem.canonical_solution, "raw").passed, problem.task_id
        assert not check(problem, "    return None\n", "raw").passed, problem.task_id
    chat_reply = f"Here you go:\n```python\n{problems[0].prompt}{problems[0].canonical_solution}```\nDone."
    assert check(problems[0], chat_reply, "chat").passed
    assert "check(has_close_elements)" in program(problems[0], "", "raw")
