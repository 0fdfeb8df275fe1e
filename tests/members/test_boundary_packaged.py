"""The two failures that prompted prompt-boundary correction, as regression tests on Qwen.

1. Qwen writes `Generators` as `Gener|ators`; once a member with another tokenizer committed
   `Gen`, Qwen fed the token `Gen` predicted `ers` and the reply read "Geners".
2. Qwen writes `"\\n    return"` as `"\\n" "   " " return"`; after four committed spaces (one
   token for members that have it), Qwen fed `"    "` as one token predicted a newline, and the
   ensemble looped on lines of spaces.
Each is checked with the correction (the word and the statement go on) and without it (the
failure is still there: the test would catch the correction going missing).
"""

from __future__ import annotations

import pytest
from conftest import packaged_member

from ensemble_core.members.contract import Boundary, RequestId
from ensemble_core.members.own_choice import greedy_choice

pytestmark = pytest.mark.packaged
QWEN = "qwen2.5-coder-0.5b-instruct"
RID = RequestId(1)
HUMANEVAL_STYLE = (
    "from typing import List\n\n\ndef below_zero(operations: List[int]) -> bool:\n"
    '    """ Given a list of deposit and withdrawal operations on a bank account that starts with\n'
    "    zero balance, return True if the balance ever falls below zero, otherwise False.\n"
    "    >>> below_zero([1, 2, -4, 5])\n    True\n"
    '    """\n'
)


def continue_greedily(member, prompt, committed: bytes, boundary: Boundary, steps: int) -> bytes:
    """What the member writes after text another member committed, choosing alone."""
    session = member.start({RID: member.render(prompt)}, boundary)
    session.commit(RID, committed)
    written = b""
    for _ in range(steps):
        [distribution] = session.next([RID])
        choice = greedy_choice(member.vocab, distribution)
        if choice.eos:
            break
        session.write(RID, distribution, choice.pick)
        session.commit(RID, choice.text)
        written += choice.text
    return written


def test_a_word_cut_inside_one_of_qwens_tokens_goes_on_as_the_word() -> None:
    qwen = packaged_member(QWEN)
    prompt = [{"role": "user", "content": "Explain generators in Python in two sentences."}]
    corrected = continue_greedily(qwen, prompt, b"Gen", Boundary.CORRECT, 3)
    assert corrected.startswith(b"erators"), corrected
    broken = continue_greedily(qwen, prompt, b"Gen", Boundary.RETOKENIZE, 3)
    assert not broken.startswith(b"erators"), broken  # what the reply used to read ("Geners ...")


def test_indentation_committed_as_one_token_goes_on_with_a_statement() -> None:
    qwen = packaged_member(QWEN)
    corrected = continue_greedily(qwen, HUMANEVAL_STYLE, b"    ", Boundary.CORRECT, 4)
    assert corrected[:1].isalpha() or corrected.startswith((b"#", b"_")), corrected  # e.g. "balance = 0"
    broken = continue_greedily(qwen, HUMANEVAL_STYLE, b"    ", Boundary.RETOKENIZE, 4)
    assert broken.startswith((b"\n", b" ")), broken  # a newline or more spaces: the old loop


def test_the_prompts_own_end_is_re_read_with_the_reply() -> None:
    """The raw prompt ends in `\"\"\"\\n`, one Qwen token that a following newline would change:
    its history stops before it, and the first step covers it."""
    qwen = packaged_member(QWEN)
    session = qwen.start({RID: qwen.render(HUMANEVAL_STYLE)}, Boundary.CORRECT)
    [distribution] = session.next([RID])
    assert not distribution.exact
    covering = distribution.origin.covering
    assert covering.rest.endswith(b'"""\n')
    choice = greedy_choice(qwen.vocab, distribution)
    assert choice.text == b"   ", choice.text  # the body's indentation, as Qwen writes it: "   " + " balance"
