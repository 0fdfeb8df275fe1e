"""One JSON line per configuration x task x problem: what was asked, what came back, what it cost.

The file is the run's state: an evaluation appends a batch's records as soon as the batch is
scored, and a later run with the same file skips every (configuration, task, problem) it holds,
so an interrupted evaluation resumes where it stopped. A configuration is stored with a
fingerprint of its definition; running a changed definition under the same name against an old
file is an error instead of a silent mix of two experiments.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ensemble_core.errors import ConfigError


@dataclass(frozen=True)
class Record:
    """One problem's result under one configuration.

    Attributes:
        config / fingerprint: the configuration's name and a hash of its definition.
        task / item: the task key ("gsm8k:raw") and the problem id.
        correct / extracted / detail: the score, the answer read from the reply, and why.
        prompt / reply / answer: what was asked (as given to the ensemble), the reply text and
            the reference answer.
        finish_reason: "stop" | "length" | "eos" (None for option scoring).
        tokens: reply tokens, counted in the method's reference member's tokens.
        batch / batch_size / batch_seconds / batch_tokens: the batch the problem ran in (wall
            seconds of the whole batch, and its total reply tokens).
        member_seconds: per member, forward seconds over the whole batch.
        share_ensembled: the share of the reply's tokens decided by several members.
        method_stats: the method's figures for this reply (its typed stats, as a dict).
        options: option scoring: the ensemble's probability per option.
        flags: named symptoms the task found in the reply (e.g. "whitespace_loop").
    """

    config: str
    fingerprint: str
    task: str
    item: str
    correct: bool
    extracted: str | None
    detail: str
    prompt: Any
    reply: str
    answer: str
    finish_reason: str | None
    tokens: int
    batch: int
    batch_size: int
    batch_seconds: float
    batch_tokens: int
    member_seconds: dict[str, float] = field(default_factory=dict)
    share_ensembled: float | None = None
    method_stats: dict[str, Any] = field(default_factory=dict)
    options: list[float] | None = None
    flags: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.config, self.task, self.item)


class RecordFile:
    """The JSONL file of an evaluation: what it holds, and appending to it."""

    def __init__(self, path: Path):
        self.path = path
        self.records: dict[tuple[str, str, str], Record] = {}
        self._fingerprints: dict[str, str] = {}
        if path.exists():
            _drop_cut_line(path)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    self._take(_parse(line, path, number))
        self._size = _size(path)  # what this object has read and written: `replace` checks it

    def _take(self, record: Record) -> None:
        self.records[record.key] = record
        self._fingerprints.setdefault(record.config, record.fingerprint)

    def check_fingerprint(self, config: str, fingerprint: str) -> None:
        """Refuse to mix two definitions of one configuration name in one file."""
        held = self._fingerprints.get(config)
        if held is not None and held != fingerprint:
            raise ConfigError(
                f"{self.path} holds results of a configuration named {config!r} with a different definition "
                "(members, method, parameters, weights or boundary changed). Give the changed configuration "
                "a new `name`, or write to another output folder."
            )

    def done(self, config: str, task: str, item: str) -> bool:
        return (config, task, item) in self.records

    def append(self, records: Iterable[Record]) -> None:
        """Write records and make them durable before returning (a crash loses nothing written)."""
        batch = list(records)
        if not batch:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for record in batch:
                handle.write(_line(record))
            handle.flush()
            os.fsync(handle.fileno())
        self._size = _size(self.path)
        for record in batch:
            self._take(record)

    def replace(self, records: Iterable[Record]) -> None:
        """Put changed records in place of the held ones with the same keys and rewrite the
        file whole (a new file moved over the old one, so a crash leaves one or the other)."""
        changed = list(records)
        if not changed:
            return
        missing = [record.key for record in changed if record.key not in self.records]
        if missing:
            raise KeyError(f"{self.path} holds no record for {missing[0]}")
        if _size(self.path) != self._size:
            raise ConfigError(
                f"{self.path} changed since it was read (is another evaluation writing to it?); wait for it "
                "to finish and run this again."
            )
        held = dict(self.records)
        held.update((record.key, record) for record in changed)
        fresh = self.path.with_name(self.path.name + ".new")
        try:
            with fresh.open("w", encoding="utf-8") as handle:
                for record in held.values():
                    handle.write(_line(record))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(fresh, self.path)
        finally:
            fresh.unlink(missing_ok=True)
        self.records = held
        self._size = _size(self.path)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records.values())


def _line(record: Record) -> str:
    """A record as the one JSON line the file holds for it."""
    return json.dumps(asdict(record), ensure_ascii=False) + "\n"


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _drop_cut_line(path: Path) -> None:
    """A write interrupted mid-line (Ctrl-C, a crash) leaves a last line without its newline:
    cut it off, so the problem it was about runs again."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def _parse(line: str, path: Path, number: int) -> Record:
    try:
        return Record(**json.loads(line))
    except (json.JSONDecodeError, TypeError) as error:
        raise ConfigError(
            f"{path}:{number} is not an evaluation record ({error}); is this the right file? "
            "Point the evaluation at another output folder."
        ) from None
