"""Why an ensemble lost a problem: how its wrong replies fail, and where each reply it lost
leaves the text of the member that solved the problem.

An accuracy says how often, not why. When an ensemble is worse than its best member, the
question a user has is whether the members' quality or the ensembling broke the reply: code
that runs and returns the wrong value, or one that does not parse; a reply that leaves the best
member's text between two words (a different choice of what to write), or in the middle of a
word (the split words that broken prompt boundaries write). Both are read from the records, so
a report explains every lost problem without running anything again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ensemble_core.eval.records import Record

WRONG_ANSWER = "wrong answer"
NO_ANSWER = "no answer"
ASSERTION = "failed a test"
RUNTIME_ERROR = "raised an error"
DOES_NOT_PARSE = "does not parse"
TIMEOUT = "timed out"
FAILURE_KINDS = (WRONG_ANSWER, NO_ANSWER, ASSERTION, RUNTIME_ERROR, DOES_NOT_PARSE, TIMEOUT)

BETWEEN_WORDS = "between words"
INSIDE_WORD = "inside a word"
ONE_ENDS = "one ends"  # one reply stops where the other goes on
SAME_TEXT = "same text"  # identical replies scored differently (a flaky timeout)
OTHER_OPTION = "another option"  # option scoring: nothing was written
PLACES = (BETWEEN_WORDS, INSIDE_WORD, ONE_ENDS, SAME_TEXT, OTHER_OPTION)

_RAISED = re.compile(r"([A-Za-z_][\w.]*)(?::|$)")  # a traceback's last line: "ValueError: ..."
_PARSE_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError"})
_EXCERPT = 40


def failure_kind(record: Record) -> str | None:
    """How a wrong reply failed (one of `FAILURE_KINDS`); None for a correct one.

    Tasks that read an answer (a number, a letter) fail as a wrong or a missing answer; tasks
    that run code (`detail` holds the status and the end of the traceback) by the exception
    that stopped the tests."""
    if record.correct:
        return None
    detail = record.detail
    if not detail:
        return NO_ANSWER if record.extracted is None else WRONG_ANSWER
    if detail.startswith("timeout"):
        return TIMEOUT
    raised = raised_exception(detail.removeprefix("failed: "))  # (the sandbox's status first)
    if raised in _PARSE_ERRORS:
        return DOES_NOT_PARSE
    return ASSERTION if raised == "AssertionError" else RUNTIME_ERROR


def raised_exception(detail: str) -> str | None:
    """The name of the exception a traceback ends in (its last line that starts with a name and
    a colon, or is a bare name), without its module; None when there is none."""
    for line in reversed(detail.splitlines()):
        match = _RAISED.match(line)
        if match:
            return match.group(1).rsplit(".", 1)[-1]
    return None


@dataclass(frozen=True)
class Departure:
    """Where a reply first differs from a reference reply to the same prompt.

    Attributes:
        offset: characters the two replies share before they differ.
        place: one of `PLACES`: `INSIDE_WORD` when the shared text ends inside a word that both
            replies go on with differently (a letter, digit or underscore on both sides of the
            cut); `BETWEEN_WORDS` for a different choice at a word's start; `ONE_ENDS` when one
            reply stops where the other goes on; `SAME_TEXT` when they do not differ.
        before: the last characters of the shared text.
        mine / theirs: what each reply writes from there (a short excerpt).
    """

    offset: int
    place: str
    before: str
    mine: str
    theirs: str


def first_departure(reply: str, reference: str, prompt_end: str = "") -> Departure:
    """The first difference between `reply` and `reference` (`prompt_end`: the text before both,
    so a reply that differs from its first character is judged against the prompt's end)."""
    shortest = min(len(reply), len(reference))
    offset = next((i for i, (a, b) in enumerate(zip(reply, reference, strict=False)) if a != b), shortest)
    shared = prompt_end + reply[:offset]
    if reply == reference:
        place = SAME_TEXT
    elif offset == shortest:
        place = ONE_ENDS
    elif shared and _word_char(shared[-1]) and (_word_char(reply[offset]) or _word_char(reference[offset])):
        place = INSIDE_WORD
    else:
        place = BETWEEN_WORDS
    return Departure(
        offset=offset,
        place=place,
        before=shared[-_EXCERPT:],
        mine=reply[offset : offset + _EXCERPT],
        theirs=reference[offset : offset + _EXCERPT],
    )


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def prompt_end(record: Record) -> str:
    """The text a reply continues: a raw prompt; nothing for chat (a reply starts a new turn)."""
    return record.prompt if isinstance(record.prompt, str) else ""


@dataclass(frozen=True)
class Loss:
    """A problem the best member solved and the configuration did not."""

    item: str
    failure: str | None
    departure: Departure


def loss(mine: Record, best: Record) -> Loss:
    """The loss of `mine` against the best member's `best` on the same problem (for option
    scoring, the two options chosen: nothing was written, so no place in a text)."""
    if mine.options is not None:
        return Loss(mine.item, failure_kind(mine), Departure(0, OTHER_OPTION, "", mine.reply, best.reply))
    return Loss(mine.item, failure_kind(mine), first_departure(mine.reply, best.reply, prompt_end(mine)))
