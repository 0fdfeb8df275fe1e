"""The report of an evaluation: a markdown table per task, paired comparisons, and plots.

Per configuration and task: accuracy with its 95% interval, the paired comparison with the best
of the configuration's own members on the same problems (won / lost, sign-test p; a difference
that could be noise reads "tie"), cost (ms per reply token over whole batches, as run), the
share of tokens several members decided, and each member's forward seconds per reply token.
Below each table, how the wrong replies fail and where the problems lost to the best member
leave its text (`diagnosis`); `losses.md` lists every such problem.
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ensemble_core.eval.diagnosis import FAILURE_KINDS, PLACES, Loss, failure_kind, loss
from ensemble_core.eval.records import Record
from ensemble_core.eval.stats import Paired, paired, wilson

REPORT_FILE = "report.md"
LOSSES_FILE = "losses.md"


@dataclass
class Row:
    """One configuration on one task, summarised."""

    config: str
    task: str
    members: tuple[str, ...]
    alone: bool
    correct: int
    total: int
    tokens: int
    seconds: float
    member_seconds: dict[str, float]
    share_ensembled: float | None
    flags: dict[str, int] = field(default_factory=dict)
    boundary: str = "correct"
    best_member: str | None = None
    versus_best: Paired | None = None
    details: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    losses: list[Loss] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict, repr=False)

    @property
    def outcomes(self) -> dict[str, bool]:
        """Whether each problem was solved, by item (what the paired comparison reads)."""
        return {item: record.correct for item, record in self.records.items()}

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.correct, self.total)

    @property
    def ms_per_token(self) -> float | None:
        return 1000 * self.seconds / self.tokens if self.tokens else None

    @property
    def ms_per_problem(self) -> float:
        return 1000 * self.seconds / self.total if self.total else 0.0


def summarise(
    records: Iterable[Record],
    members_of: dict[str, tuple[str, ...]],
    boundary_of: dict[str, str] | None = None,
) -> dict[str, list[Row]]:
    """Rows per task, in the order configurations first appear; `members_of` maps a
    configuration name to its member aliases (to find its members' own rows), `boundary_of`
    to its boundary handling (an ensemble is compared with its members under the same one)."""
    grouped: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in records:
        grouped[(record.task, record.config)].append(record)
    by_task: dict[str, list[Row]] = defaultdict(list)
    for (task, config), group in grouped.items():
        row = _row(task, config, group, members_of.get(config, ()))
        row.boundary = (boundary_of or {}).get(config, "correct")
        by_task[task].append(row)
    for rows in by_task.values():
        _compare_with_best_member(rows)
    return dict(by_task)


def _row(task: str, config: str, group: list[Record], members: tuple[str, ...]) -> Row:
    batches: dict[int, Record] = {}
    for record in group:
        batches.setdefault(record.batch, record)
    member_seconds: dict[str, float] = defaultdict(float)
    for record in batches.values():
        for name, seconds in record.member_seconds.items():
            member_seconds[name] += seconds
    shares = [r.share_ensembled for r in group if r.share_ensembled is not None]
    flags: dict[str, int] = defaultdict(int)
    failures: dict[str, int] = defaultdict(int)
    for record in group:
        for flag in record.flags:
            flags[flag] += 1
        kind = failure_kind(record)
        if kind is not None:
            failures[kind] += 1
    return Row(
        config=config,
        task=task,
        members=members,
        alone=config.endswith(" alone") or config.endswith(" alone [retokenize]"),
        correct=sum(r.correct for r in group),
        total=len(group),
        tokens=sum(r.tokens for r in group),
        seconds=sum(r.batch_seconds for r in batches.values()),
        member_seconds=dict(member_seconds),
        share_ensembled=sum(shares) / len(shares) if shares else None,
        flags=dict(flags),
        failures=dict(failures),
        records={r.item: r for r in group},
    )


def _compare_with_best_member(rows: list[Row]) -> None:
    """Each ensemble row against the best row among its members alone (same task, same problems)."""
    alone = {(row.members[0], row.boundary): row for row in rows if row.alone and len(row.members) == 1}
    for row in rows:
        if row.alone or not row.members:
            continue
        same = [alone[(m, row.boundary)] for m in row.members if (m, row.boundary) in alone]
        mine = same or [r for (m, _), r in alone.items() if m in row.members]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r.accuracy, -row.members.index(r.members[0])))
        row.best_member = best.config
        row.versus_best = paired(row.outcomes, best.outcomes)
        row.losses = [
            loss(record, best.records[item])
            for item, record in row.records.items()
            if not record.correct and item in best.records and best.records[item].correct
        ]


def render(
    rows_by_task: dict[str, list[Row]], sources: dict[str, str], plots: dict[str, list[Path]], command: str, out: Path
) -> str:
    """The markdown report (plots linked relative to `out`)."""
    lines = [
        "# Evaluation report",
        "",
        f"Made {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()} "
        f"({platform.processor() or 'unknown processor'}), Python {platform.python_version()}.",
        "",
        f"Reproduce with: `{command}`",
        "",
        "Accuracy with a 95% Wilson interval. *vs best member*: the configuration against the best of its own "
        "members alone on the same problems: problems won / lost, exact sign-test p; `tie` unless p < 0.05. "
        "Cost is wall time of whole batches (as run) per reply token, counted in the method's reference "
        "member's tokens; *member s/token*: each member's forward seconds per reply token.",
        "",
    ]
    for task, rows in rows_by_task.items():
        lines += [f"## {task}", "", f"Data: {sources.get(task, 'unknown')}.", ""]
        lines += table(rows)
        lines += failure_table(rows)
        for plot in plots.get(task, []):
            lines += ["", f"![{plot.stem}]({plot.relative_to(out).as_posix()})"]
        lines.append("")
    return "\n".join(lines) + "\n"


def failure_table(rows: Sequence[Row]) -> list[str]:
    """How each configuration's wrong replies fail, and where its losses to the best member
    leave that member's text (between words, or inside a word); empty when nothing is wrong."""
    kinds = [kind for kind in FAILURE_KINDS if any(kind in row.failures for row in rows)]
    if not kinds:
        return []
    header = ["configuration", "wrong", *kinds, "lost to best member: where the reply leaves its text"]
    lines = [
        "",
        f"How the wrong replies fail (per-problem losses in [{LOSSES_FILE}]({LOSSES_FILE})):",
        "",
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
    ]
    for row in rows:
        counts = " | ".join(str(row.failures.get(kind, 0)) for kind in kinds)
        places = [lost.departure.place for lost in row.losses]
        where = ", ".join(f"{places.count(place)} {place}" for place in PLACES if place in places)
        lines.append(f"| {row.config} | {row.total - row.correct} | {counts} | {where} |")
    return lines


def render_losses(rows_by_task: dict[str, list[Row]]) -> str:
    """`losses.md`: every problem a configuration lost to its best member, with how the reply
    failed and the first place it leaves the best member's text."""
    lines = [
        "# Problems lost to the best member",
        "",
        "Each problem the best member alone solved and the configuration did not: how the "
        "configuration's reply failed, and the first place its text leaves the member's (the shared text "
        "before it, then what each writes; newlines shown as \\n). *Inside a word*: the replies part in the "
        "middle of a word, which is where a broken prompt boundary splits words (the other cause: two "
        "different words that start alike, as `C|onvert` and `C|reate`); *between words*: a different "
        "choice of what to write next; *one ends*: one reply "
        "stops where the other goes on; *same text*: the same reply, scored differently (a flaky timeout).",
    ]
    for task, rows in rows_by_task.items():
        for row in rows:
            if not row.losses:
                continue
            lines += ["", f"## {task}: {row.config} (against {row.best_member})", ""]
            lines += ["| problem | reply | leaves it | shared text | configuration writes | best member writes |"]
            lines += ["|---|---|---|---|---|---|"]
            for lost in row.losses:
                d = lost.departure
                lines.append(
                    f"| {lost.item} | {lost.failure or ''} | {d.place} | {_code(d.before)} | {_code(d.mine)} "
                    f"| {_code(d.theirs)} |"
                )
    return "\n".join(lines) + "\n"


_VISIBLE = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "|": "\\|"}


def _code(text: str) -> str:
    """Text as an inline code span that a markdown table cell keeps whole: line breaks and tabs
    shown as escapes, pipes escaped, a fence longer than any backtick run inside."""
    if not text:
        return "*(end)*"
    shown = "".join(_VISIBLE.get(char, char) for char in text)
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", shown)), default=0))
    pad = "" if shown.strip(" ") == "" else " "  # an all-space span keeps its spaces unpadded
    return f"{fence}{pad}{shown}{pad}{fence}"


def table(rows: Sequence[Row]) -> list[str]:
    """The markdown table of one task's rows."""
    options = all(r.tokens == 0 for r in rows)
    cost = "ms / problem" if options else "ms / token"
    flagged = sorted({flag for row in rows for flag in row.flags})
    header = ["configuration", "accuracy", "95% CI", "vs best member (won/lost, p)", cost, "share ensembled"]
    header += [f"replies with {flag.replace('_', ' ')}" for flag in flagged]
    lines = ["| " + " | ".join([*header, "member s/token"]) + " |", "|---" * (len(header) + 1) + "|"]
    for row in rows:
        low, high = row.interval
        versus = ""
        if row.versus_best is not None:
            v = row.versus_best
            versus = f"{v.verdict} vs {row.best_member}: +{v.won}/-{v.lost}, p={v.p_value:.2f}"
        spend = f"{row.ms_per_problem:.0f}" if options else (f"{row.ms_per_token:.0f}" if row.ms_per_token else "")
        share = "" if row.share_ensembled is None or row.alone else f"{row.share_ensembled:.0%}"
        per_member = (
            ", ".join(f"{name} {seconds / row.tokens:.3f}" for name, seconds in row.member_seconds.items())
            if row.tokens
            else ""
        )
        symptoms = "".join(f" {row.flags.get(flag, 0)} |" for flag in flagged)
        lines.append(
            f"| {row.config} | {row.correct}/{row.total} = {row.accuracy:.1%} | {low:.0%}-{high:.0%} | {versus} "
            f"| {spend} | {share} |{symptoms} {per_member} |"
        )
    return lines
