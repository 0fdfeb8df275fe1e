"""Who pulled an ensemble away from its best member? Each member's vote where a lost reply departs.

    python benchmarks/explain_losses.py --config docs/results/boundary/config.yaml \\
        --configuration "gac(qwen+smol+gemma)"

An evaluation's report (`losses.md`) shows, for each problem an ensemble lost to its best
member, where the ensemble's reply first leaves that member's text. This asks every member
alone, at that point (the prompt plus the text both replies share, boundary-corrected as in the
run), which way on it prefers: the rest of the ensemble's line or the rest of the best member's.
When the best member prefers its own line and another member the ensemble's, the others
outvoted it: the loss comes from their quality, not from how the votes were combined.

Lines, not words: an option is scored as the token chain that spells it, and a word can be the
start of a longer token (Qwen writes `.lower` as one token, so its probability of a bare `.`
says nothing about `.lower`); a line ends where code tokenizers end their tokens. A longer line
is less likely for every member alike, so a single member's figure leans to the shorter line;
what the table shows is where the members disagree. Reads the records of a finished
evaluation; loads each member once.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_OFFLINE", "1")

if TYPE_CHECKING:
    from ensemble_core import Ensemble
    from ensemble_core.chat.templates import Prompt
    from ensemble_core.eval.diagnosis import Loss
    from ensemble_core.eval.report import Row


def rest_of_line(text: str) -> str:
    """`text` up to and including its first newline (all of it when it has none)."""
    end = text.find("\n")
    return text if end < 0 else text[: end + 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the evaluation's YAML config")
    parser.add_argument("--configuration", required=True, help="the ensemble configuration to explain")
    args = parser.parse_args()

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.eval.config import load_config
    from ensemble_core.eval.output import summarised
    from ensemble_core.eval.records import RecordFile
    from ensemble_core.eval.runner import RECORDS_FILE

    config = load_config(args.config)
    spec = next((s for s in config.expanded() if s.label() == args.configuration), None)
    if spec is None:
        raise SystemExit(f"{args.config} has no configuration named {args.configuration!r}.")
    rows_by_task = summarised(config, RecordFile(Path(config.output) / RECORDS_FILE))
    members = {}
    for task, rows in rows_by_task.items():
        row = next((r for r in rows if r.config == args.configuration), None)
        losses = [lost for lost in (row.losses if row else []) if lost.departure.mine and lost.departure.theirs]
        if row is None or not losses:
            continue
        best = next(r for r in rows if r.config == row.best_member)
        asked = []  # (prompt, the reply so far, the two lines)
        for lost in losses:
            mine, theirs, at = row.records[lost.item], best.records[lost.item], lost.departure.offset
            asked.append(
                (mine.prompt, mine.reply[:at], [rest_of_line(mine.reply[at:]), rest_of_line(theirs.reply[at:])])
            )
        votes: dict[str, list[float]] = {}
        for alias in spec.members:
            if alias not in members:
                members[alias] = HFMember.from_pretrained(
                    config.model_of(alias), device="cpu", dtype=config.dtype, name=alias
                )
            alone = Ensemble([members[alias]], method="single", boundary=spec.boundary)
            votes[alias] = [share_of_first(alone, *question) for question in asked]
        report(task, args.configuration, row, losses, [question[2] for question in asked], votes)


def share_of_first(alone: Ensemble, prompt: Prompt, written: str, lines: list[str]) -> float:
    """A member's probability of the first line over both, after `written` (a raw prompt takes it
    as its own text; a chat prompt as the start of the reply)."""
    if isinstance(prompt, str):
        return alone.option_probabilities([prompt + written], [lines])[0][0]
    return alone.option_probabilities([prompt], [lines], reply_prefix=written)[0][0]


def report(
    task: str, configuration: str, row: Row, losses: list[Loss], options: list[list[str]], votes: dict[str, list[float]]
) -> None:
    """The table of one configuration's lost problems, and how many were outvoted."""
    best = next(alias for alias in votes if row.best_member.startswith(f"{alias} alone"))
    print(f"\n## {task}: {configuration} against {row.best_member} ({len(losses)} lost problems)\n")
    columns = " | ".join(f"{alias}: P(ensemble's)" for alias in votes)
    print(f"| problem | ensemble's line | best member's line | {columns} |")
    print("|---" * (3 + len(votes)) + "|")
    outvoted = 0
    for index, lost in enumerate(losses):
        others = [votes[alias][index] for alias in votes if alias != best]
        outvoted += votes[best][index] < 0.5 and any(share > 0.5 for share in others)
        cells = " | ".join(f"{votes[alias][index]:.2f}" for alias in votes)
        mine, theirs = (repr(option)[1:-1].replace("|", "\\|") for option in options[index])
        print(f"| {lost.item} | `{mine}` | `{theirs}` | {cells} |")
    print(
        f"\n{best} preferred its own line and another member the ensemble's at {outvoted} of the {len(losses)} "
        "departures (P: each member's probability of the ensemble's line, normalised over the two lines)."
    )


if __name__ == "__main__":
    main()
