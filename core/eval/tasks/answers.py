"""Reading a final answer out of a free-text reply (math word problems, multiple choice)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"
_STATED = re.compile(rf"(?:answer is|answer:|####)\s*\**\s*({_NUMBER})", re.I)
_ANY = re.compile(_NUMBER)


def final_number(reply: str) -> str | None:
    """The reply's answer: the last number stated as the answer ("The answer is 18", "#### 18"),
    else the last number in the reply; commas and a dollar sign dropped. None: no number."""
    stated = _STATED.findall(reply)
    found = stated[-1] if stated else (_ANY.findall(reply) or [None])[-1]
    if found is None:
        return None
    return found.replace(",", "").replace("$", "").rstrip(".")


def same_number(found: str | None, expected: str) -> bool:
    """Whether two numbers written as text are equal (18 == 18.0; a missing answer is wrong)."""
    if found is None:
        return False
    try:
        return Decimal(found) == Decimal(expected.replace(",", ""))
    except InvalidOperation:
        return False


def first_label(reply: str, labels: tuple[str, ...]) -> str | None:
    """The first option label standing alone in the reply ("C", "(C)", "C." or "Answer: C")."""
    for match in re.finditer(r"[A-Za-z0-9]+", reply):
        if match.group(0) in labels:
            return match.group(0)
    return None
