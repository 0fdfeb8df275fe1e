"""Torch work that moves between threads at full speed: a thread leaving it gives back its OpenMP workers.

GNU OpenMP (libgomp, which the Linux torch wheels ship) keeps a pool of worker threads for
every thread that has run a parallel region, and once all pools together hold more threads
than there are CPUs it throttles their spin-waiting: every parallel region then wakes its
workers through the kernel. A decode step is hundreds of small parallel regions, so a process
that loads its models in one thread and generates in another (asyncio's worker, the batcher,
a web server's thread pool) pays on every step. Measured on 2 cores: SmolLM2 decoded 1.68x
and Qwen2.5-0.5B 1.22x slower in a second thread than in the main thread, and SAFE over both
1.27x (`benchmarks/bench_adapters.py` measures the async adapters and `asyncio.to_thread`).

`omp_pause_resource_all` (OpenMP 5.0) frees the calling thread's pool; the thread's next
parallel region builds a new one, which costs a thread start per worker (microseconds), not a
step's worth of throttled wake-ups. It frees only the calling thread's pool and refuses inside
a parallel region, so calling it from Python between calls is always safe. Runtimes without
it (MSVC's OpenMP, a torch built without OpenMP) make this a no-op.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

_PAUSE_SOFT = 1  # omp_pause_soft: release threads, keep what is cheap to keep


@functools.cache
def _pause_resource_all() -> Callable[[int], int] | None:
    import torch  # noqa: F401  (loads the OpenMP runtime torch uses, so the lookup finds it)

    try:
        process = ctypes.CDLL(None)
    except (OSError, TypeError):  # no process-wide symbol lookup (Windows)
        return None
    pause = getattr(process, "omp_pause_resource_all", None)
    if pause is None:
        return None
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int
    return pause


def release_openmp_workers() -> bool:
    """Give back this thread's OpenMP worker threads; True when the runtime released them."""
    pause = _pause_resource_all()
    return pause is not None and pause(_PAUSE_SOFT) == 0
