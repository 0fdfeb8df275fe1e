"""Counting the reads of tensor values by Python: on a GPU, each is a device->host sync.

Between two forwards a decode step should read its device values about once (one packed summary
per member, one decision); every `int(t)`, `t.item()`, `t.tolist()`, `if t.any():` or
`torch.unique(t)` hands a value to Python, and on CUDA waits for the device's queue to drain.
`HostReads` counts them wherever they happen, by kind and by the line that asked, so a test can
pin a method's count and a benchmark can show it per committed token. On the CPU the same
calls are only slow Python; keeping host-only bookkeeping out of torch (plain Python or numpy)
is what makes this count equal the syncs a GPU would see.

Example::

    with HostReads() as reads:
        ensemble.generate(prompt, max_new_tokens=32)
    reads.total, reads.by_site.most_common(5)
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from torch.overrides import TorchFunctionMode

READ_FUNCTIONS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero", "unique"}
)
"""What hands a tensor's values to Python (`nonzero` and `unique` size their output from them)."""

_HERE = os.path.dirname(os.path.abspath(__file__))


class HostReads(TorchFunctionMode):
    """A torch function mode that counts reads of tensor values (see the module docstring).

    Attributes:
        by_kind: read function name -> count.
        by_site: "file:line function" of the first caller outside torch -> count.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_kind: Counter[str] = Counter()
        self.by_site: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READ_FUNCTIONS:
            self.by_kind[name] += 1
            self.by_site[f"{_caller()} {name}"] += 1
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    """The first frame outside torch (and this module): the line that asked for the read."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{os.sep}torch{os.sep}" not in path and not path.startswith(_HERE + os.sep + "host_reads"):
            return (
                f"{os.path.relpath(path, os.path.dirname(_HERE)) if path.startswith(_HERE) else path}:{frame.f_lineno}"
            )
        frame = frame.f_back
    return "?"
