"""A thread that leaves torch work gives back its OpenMP workers (`ensemble_core.openmp`).

The evidence is the process's own thread list: a thread's OpenMP pool is real OS threads, so
releasing it shows in /proc/self/task. (The speed that this buys is in benchmarks/, not here.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import packaged_member

from ensemble_core import Ensemble
from ensemble_core.openmp import release_openmp_workers

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux /proc")

WORKERS = 2  # threads per parallel region: the pool then holds one worker besides its master


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settled(count: Callable[[], int], target: int) -> int:
    """`count()` once it reaches `target`, or its last value after 5 s (exiting threads linger briefly)."""
    deadline = time.monotonic() + 5
    while (now := count()) != target and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


@pytest.fixture
def two_workers() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def in_new_thread(work: Callable[[], object]) -> object:
    """`work()` in a thread of its own (which ends with the call), two OpenMP workers per region."""

    def with_workers() -> object:
        torch.set_num_threads(WORKERS)
        return work()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(with_workers).result()


def parallel_region() -> None:
    big = torch.ones(4_000_000)
    assert float((big * 2).sum()) == 8_000_000.0  # far above torch's grain size: runs on the pool


def test_releasing_ends_this_threads_pool(two_workers: None) -> None:
    def work() -> tuple[int, int, int, bool]:
        alone = os_threads()
        parallel_region()
        with_pool = os_threads()
        released = release_openmp_workers()
        return alone, with_pool, settled(os_threads, alone), released

    alone, with_pool, after, released = in_new_thread(work)  # type: ignore[misc]
    assert released
    assert with_pool == alone + WORKERS - 1
    assert after == alone


def test_releasing_in_a_thread_without_a_pool_is_harmless(two_workers: None) -> None:
    def work() -> tuple[bool, bool]:
        first = release_openmp_workers()
        parallel_region()  # a pool is built again on demand
        return first, release_openmp_workers()

    assert in_new_thread(work) == (True, True)


def test_a_thread_that_generated_keeps_no_openmp_workers(two_workers: None) -> None:
    ensemble = Ensemble([packaged_member("smollm2-135m-instruct")], method="single")
    expected = ensemble.generate("The quick brown fox", max_new_tokens=8).text

    def work() -> tuple[int, int, str]:
        alone = os_threads()
        text = ensemble.generate("The quick brown fox", max_new_tokens=8).text
        return alone, settled(os_threads, alone), text

    alone, after, text = in_new_thread(work)  # type: ignore[misc]
    assert text == expected
    # Kept, that idle pool would throttle the next generating thread's parallel regions.
    assert after == alone
