"""KVBatch: cached incremental logits equal a full uncached forward, through every move.

Tiny random-weight float32 models on the packaged models' real tokenizers; one of each
architecture we ship (Llama, Qwen2 with a padded head, Gemma-3 with a sliding window of 4
tokens so rollbacks cross the window). Tolerance: float32, atol 1e-4 on logits of scale ~1.
"""

from __future__ import annotations

import random

import pytest
import torch

from ensemble_core.errors import ConfigError
from ensemble_core.members.kv_batch import KVBatch, ScoreRequest
from reference import ATOL, assert_rows_match_uncached, uncached_all_logits, uncached_next_logits

ARCHS = ["tiny-llama", "tiny-qwen2", "tiny-gemma3"]


def random_ids(rng: random.Random, member, count: int) -> list[int]:
    return [rng.randrange(100, len(member.table)) for _ in range(count)]


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_logits_match_uncached_through_extends_and_crops(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(1)
    prompt = random_ids(rng, member, 5)
    batch = KVBatch(member.model, [prompt])
    for _ in range(40):
        ids = batch.ids(0)
        torch.testing.assert_close(batch.next_logits()[0], uncached_next_logits(member.model, ids), atol=ATOL, rtol=0)
        move = rng.random()
        if move < 0.55:
            batch.extend(0, random_ids(rng, member, 1))
        elif move < 0.8:
            batch.extend(0, random_ids(rng, member, rng.randint(2, 5)))
        else:
            batch.truncate(0, max(1, len(ids) - rng.randint(1, 6)))
    assert batch.stats.forwards <= 41  # one catch-up forward per read, never more


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_pending_keeps_logits_of_every_new_position(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(2)
    batch = KVBatch(member.model, [random_ids(rng, member, 4)])
    batch.next_logits()
    batch.extend(0, random_ids(rng, member, 6))
    batch.forward_pending(keep_all=True)
    full = uncached_all_logits(member.model, batch.ids(0))
    for index in range(batch.length(0) - 7, batch.length(0)):  # the 6 new positions and the one before
        torch.testing.assert_close(batch.logits_after(0, index), full[index], atol=ATOL, rtol=0)
    # Rolling back within the kept positions needs no forward.
    forwards = batch.stats.forwards
    batch.truncate(0, batch.length(0) - 3)
    torch.testing.assert_close(batch.next_logits()[0], full[batch.length(0) - 1], atol=ATOL, rtol=0)
    assert batch.stats.forwards == forwards


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_batch_rows_with_different_moves_match_one_at_a_time(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(3)
    prompts = [random_ids(rng, member, n) for n in (3, 9, 5)]
    batch = KVBatch(member.model, prompts)
    for _ in range(25):
        assert_rows_match_uncached(batch, member.model)
        for row in range(3):  # every row does something different: holes appear in the shared cache
            move = rng.random()
            if move < 0.5:
                batch.extend(row, random_ids(rng, member, rng.randint(1, 4)))
            elif move < 0.75:
                batch.truncate(row, max(1, batch.length(row) - rng.randint(1, 3)))
    # A finished row leaves; the others continue unchanged.
    batch.select_rows([2, 0])
    assert_rows_match_uncached(batch, member.model)


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_batch_in_lockstep_matches_one_at_a_time_even_past_the_sliding_window(arch: str, tiny_member) -> None:
    """Prompts of different lengths, then one token per row per step (as Single decodes):
    each row's tokens stay contiguous, so even Gemma-3's 4-token window is exact."""
    member = tiny_member(arch)
    rng = random.Random(4)
    prompts = [random_ids(rng, member, n) for n in (2, 11, 6)]
    batch = KVBatch(member.model, prompts)
    for _ in range(12):
        logits = assert_rows_match_uncached(batch, member.model)
        for row in range(3):
            batch.extend(row, [int(logits[row].argmax())])


@pytest.mark.parametrize("arch", ARCHS)
def test_score_in_one_forward_equals_fresh_forward_per_candidate(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(5)
    prompts = [random_ids(rng, member, 7), random_ids(rng, member, 3)]
    # Two rows that diverge leave masked slots in each other's span; with a sliding window that
    # shortens the window (see KVBatch's docstring), so the sliding-window model scores one row.
    batch = KVBatch(member.model, prompts[:1] if arch == "tiny-gemma3" else prompts)
    batch.next_logits()
    if batch.batch_size > 1:
        batch.extend(1, random_ids(rng, member, 2))
    batch.truncate(0, 5)  # scoring must see the rolled-back prefix only
    candidates = [random_ids(rng, member, n) for n in (1, 4, 6)]
    forwards_before = batch.stats.forwards
    scores = batch.score(0, candidates)
    assert batch.stats.forwards - forwards_before == 1  # ONE scoring pass, no catch-up needed
    prefix = batch.ids(0)
    for candidate, score in zip(candidates, scores, strict=True):
        logprobs = uncached_all_logits(member.model, prefix + candidate).float().log_softmax(-1)
        expected = torch.stack([logprobs[len(prefix) - 1 + j, t] for j, t in enumerate(candidate)])
        torch.testing.assert_close(score, expected, atol=ATOL, rtol=0)
    assert batch.ids(0) == prefix  # scoring leaves the row as it was
    torch.testing.assert_close(batch.next_logits()[0], uncached_next_logits(member.model, prefix), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_score_many_scores_every_rows_prefix_in_one_forward_ignoring_drafts(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(6)
    batch = KVBatch(member.model, [random_ids(rng, member, n) for n in (6, 3)])
    batch.next_logits()
    prefixes = [batch.ids(0), batch.ids(1)]
    for row in range(2):  # drafts after the prefixes, forwarded: scoring must not see them
        batch.extend(row, random_ids(rng, member, 3))
    batch.next_logits()
    requests = [ScoreRequest(row, len(prefixes[row]), [random_ids(rng, member, n) for n in (2, 5)]) for row in range(2)]
    forwards = batch.stats.forwards
    scores = batch.score_many(requests)
    assert batch.stats.forwards == forwards + 1
    for request, row_scores in zip(requests, scores, strict=True):
        prefix = prefixes[request.row]
        for candidate, score in zip(request.continuations, row_scores, strict=True):
            logprobs = uncached_all_logits(member.model, prefix + list(candidate)).float().log_softmax(-1)
            expected = torch.stack([logprobs[len(prefix) - 1 + j, t] for j, t in enumerate(candidate)])
            torch.testing.assert_close(score, expected, atol=ATOL, rtol=0)


def test_bad_batch_input_is_rejected(tiny_member) -> None:
    model = tiny_member("tiny-llama").model
    with pytest.raises(ConfigError, match="at least one prompt"):
        KVBatch(model, [])
    with pytest.raises(ConfigError, match="Prompt 1 has no tokens"):
        KVBatch(model, [[1, 2], []])
    batch = KVBatch(model, [[5, 6, 7]])
    with pytest.raises(ConfigError, match=r"`length` must be in \[1, 3\]"):
        batch.truncate(0, 0)
    with pytest.raises(ConfigError, match="at least one continuation"):
        batch.score(0, [[]])
    with pytest.raises(ConfigError, match="must be cached"):
        batch.score_many([ScoreRequest(0, 3, [[1]])])  # nothing forwarded yet
