"""Prompt-boundary correction (docs/explanation/prompt-boundary.md) against brute-force enumeration.

A member's corrected probability of each continuation must equal what enumerating ALL its
token sequences gives: every segmentation of the unstable remainder into its tokens that its
tokenizer writes there (a prefix of its canonical tokenisation of the text followed by some
continuation), then every token that finishes the remainder, each sequence scored by a plain
uncached forward. Cuts inside a word, inside a whitespace run, after a newline, inside a digit
run and inside a multi-byte character; on toy tokenizers with a few hundred tokens (byte-level
BPE with Qwen's pre-tokenizer, SentencePiece-style with byte fallback) and on the real
tokenizers of the three packaged models.
"""

from __future__ import annotations

import math

import pytest
import torch

from ensemble_core.members.contract import Boundary, Pick, RequestId
from ensemble_core.members.covering import PROBES
from ensemble_core.members.own_choice import greedy_choice
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix
from reference import uncached_all_logits

RID = RequestId(1)
CUTS = [
    ("The answer is", b" Gener"),  # inside a word
    ("def f(x):\n", b"  "),  # inside a whitespace run (indentation)
    ("x = 1", b"\n"),  # after a newline
    ("The number is", b" 123"),  # inside a digit run
    ("He said", " 你".encode()[:3]),  # inside a multi-byte character (2 of its 3 bytes)
]


def session_after(member, prompt: str, committed: bytes):
    session = member.start({RID: member.render(prompt)}, Boundary.CORRECT)
    session.commit(RID, committed)
    return session


def method_distribution(member, distribution) -> dict[object, float]:
    """Probability per continuation text (control and end tokens keyed by id)."""
    found: dict[object, float] = {}
    table = member.table
    for token, prob in enumerate(distribution.dense.tolist()):
        if prob > 0:
            key = _dense_key(table, token)
            found[key] = found.get(key, 0.0) + prob
    for group in distribution.partial:
        for token, prob in zip(group.token_ids.tolist(), group.probs.tolist(), strict=True):
            key = table.token_bytes[token][group.skip :]
            found[key] = found.get(key, 0.0) + prob
    return found


def _dense_key(table, token: int) -> object:
    spelled = table.token_bytes[token] if token < len(table) else None
    return spelled if spelled else ("control", token)


def segmentations(table, text: bytes) -> list[tuple[int, ...]]:
    """Every way to write `text` as a sequence of this vocabulary's text tokens."""
    if not text:
        return [()]
    found = []
    for end in range(1, len(text) + 1):
        for token in table.ids_by_bytes.get(text[:end], ()):
            found += [(token, *rest) for rest in segmentations(table, text[end:])]
    return found


def canonical(tokenizer, table, text: bytes) -> list[int] | None:
    try:
        ids = tokenizer.encode(text.decode("utf-8"), add_special_tokens=False)
    except UnicodeDecodeError:
        return None
    return ids if table.spell(ids) == text and all(table.token_bytes[i] for i in ids) else None


def emittable(tokenizer, table, token: int) -> bool:
    try:
        text = table.token_bytes[token].decode("utf-8")
    except UnicodeDecodeError:
        return True  # a piece of a character: not checkable on its own
    return tokenizer.encode(text, add_special_tokens=False) == [token]


def brute_force(member, session, distribution) -> dict[object, float]:
    covering = distribution.origin.covering
    table, tokenizer = member.table, member.tokenizer
    trunk = covering.trunk.ids()
    advance = list(covering.advance)
    rest = covering.rest
    partial = incomplete_utf8_suffix(rest)
    whole = table.spell(advance) + rest[: len(rest) - partial]
    tokenisations = [canonical(tokenizer, table, whole + p.encode()) for p in PROBES]
    tokenisations = [t for t in tokenisations if t is not None] or [member.vocab.encode(whole)]
    found: dict[object, float] = {}
    width = member.logits_width
    character_start = len(rest) - partial

    def is_path(segment: tuple[int, ...]) -> bool:
        """A prefix of a canonical tokenisation, or one ending at the incomplete character's
        start followed by that character's bytes as byte tokens."""
        if any(t[len(advance) : len(advance) + len(segment)] == list(segment) for t in tokenisations):
            return True
        head, tail = segment, ()
        while head and table.token_bytes[head[-1]] and len(table.token_bytes[head[-1]]) == 1:
            head, tail = head[:-1], (head[-1], *tail)
            if len(table.spell(list(head))) == character_start and is_path(head) and table.spell(list(tail)):
                return True
        return False

    for end in range(len(rest) + 1):
        paths = {segment for segment in segmentations(table, rest[:end]) if is_path(segment)}
        for segment in paths:
            logits = uncached_all_logits(member.model, trunk + list(segment)).float()
            logprobs = torch.log_softmax(logits, dim=-1)
            weight = sum(float(logprobs[len(trunk) - 1 + j, token]) for j, token in enumerate(segment))
            probs = torch.softmax(logits[-1], dim=-1)
            if end == len(rest):
                for token in range(width):
                    key = _dense_key(table, token)
                    found[key] = found.get(key, 0.0) + math.exp(weight) * float(probs[token])
                continue
            tail = rest[end:]
            for token, spelled in enumerate(table.token_bytes):
                if (
                    spelled
                    and len(spelled) > len(tail)
                    and spelled.startswith(tail)
                    and emittable(tokenizer, table, token)
                ):
                    key = spelled[len(tail) :]
                    found[key] = found.get(key, 0.0) + math.exp(weight) * float(probs[token])
    total = sum(found.values())
    return {key: value / total for key, value in found.items()}


def assert_same_distribution(ours: dict[object, float], expected: dict[object, float]) -> None:
    keys = {k for k, v in expected.items() if v > 1e-7} | {k for k, v in ours.items() if v > 1e-7}
    for key in keys:
        assert ours.get(key, 0.0) == pytest.approx(expected.get(key, 0.0), rel=2e-3, abs=1e-7), key


@pytest.mark.parametrize("kind", ["bpe", "spm"])
@pytest.mark.parametrize(("prompt", "committed"), CUTS, ids=["word", "whitespace", "newline", "digits", "utf8"])
def test_toy_vocabularies_equal_brute_force(kind: str, prompt: str, committed: bytes, toy_member) -> None:
    member = toy_member(kind)
    session = session_after(member, prompt, committed)
    [distribution] = session.next([RID])
    assert distribution is not None and distribution.origin.covering is not None
    assert_same_distribution(method_distribution(member, distribution), brute_force(member, session, distribution))


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-llama", "tiny-gemma3"])
@pytest.mark.parametrize(("prompt", "committed"), CUTS[:4], ids=["word", "whitespace", "newline", "digits"])
def test_real_vocabularies_equal_brute_force(arch: str, prompt: str, committed: bytes, tiny_member) -> None:
    member = tiny_member(arch)
    session = session_after(member, prompt, committed)
    [distribution] = session.next([RID])
    assert distribution is not None
    if distribution.origin.covering is None:
        pytest.fail("the committed text was taken as stable; this cut is meant to need a covering")
    assert_same_distribution(method_distribution(member, distribution), brute_force(member, session, distribution))


@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_the_trunk_never_changes_whatever_follows(kind: str, toy_member) -> None:
    """Stability: tokens taken into the trunk are a prefix of the canonical tokenisation of the
    committed text followed by any continuation (here: every text of the toy corpus's pieces)."""
    member = toy_member(kind)
    table, tokenizer = member.table, member.tokenizer
    followers = [b"a", b"  x", b"\n\n", b"9", b"'ll", b" word", b"\t", "好".encode(), b"ators", b"    return"]
    for prompt, committed in CUTS[:4]:
        session = session_after(member, prompt, committed)
        [distribution] = session.next([RID])
        covering = distribution.origin.covering
        if covering is None:
            continue
        unspelled = table.spell(list(covering.advance)) + covering.rest
        for follower in followers:
            ids = canonical(tokenizer, table, unspelled + follower)
            if ids is not None:
                assert ids[: len(covering.advance)] == list(covering.advance), (committed, follower)


def test_text_the_member_wrote_itself_gives_the_plain_distribution(tiny_member) -> None:
    """A member's own token is its history: after it, no covering, just its next-token softmax."""
    member = tiny_member("tiny-llama")
    session = member.start({RID: member.render("The answer is")}, Boundary.CORRECT)
    [first] = session.next([RID])
    choice = greedy_choice(member.vocab, first)
    assert session.write(RID, first, choice.pick)
    session.commit(RID, choice.text)
    [after] = session.next([RID])
    assert after.exact
    history = session.tree.head(RID).ids()
    expected = torch.softmax(uncached_all_logits(member.model, history)[-1].float(), dim=-1)
    torch.testing.assert_close(after.dense, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-llama"])
def test_foreign_text_after_an_own_token_is_read_with_it(arch: str, tiny_member) -> None:
    """The member writes " allow" (its own token), the ensemble adds "s": what it gives next must
    be its distribution after the TEXT " allows" (as if it had written none of it), not only
    continuations of " allow" that start with "s" (which wrote "allowsthe")."""
    member = tiny_member(arch)
    prompt = member.render("The tool")
    [own] = member.tokenizer.encode(" allow", add_special_tokens=False)
    written = member.start({RID: prompt}, Boundary.CORRECT)
    [first] = written.next([RID])
    if not first.exact:
        [first] = written.next([RID])
    assert written.write(RID, first, Pick(-1, own))
    written.commit(RID, b" allow")
    [_] = written.next([RID])
    written.commit(RID, b"s")
    [found] = written.next([RID])
    foreign = member.start({RID: prompt}, Boundary.CORRECT)
    foreign.commit(RID, b" allows")
    [expected] = foreign.next([RID])
    assert [g.skip for g in found.partial] == [g.skip for g in expected.partial]
    for got, want in zip(found.partial, expected.partial, strict=True):
        assert got.token_ids.tolist() == want.token_ids.tolist()
        torch.testing.assert_close(got.probs, want.probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(found.dense, expected.dense, atol=1e-5, rtol=0)
    assert member.table.spell(written.token_ids(RID)) == b" allows"
