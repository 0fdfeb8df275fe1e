"""Token tries over one KV cache: every node's logits equal an uncached forward of its ids.

Tiny random-weight float32 models on the packaged models' real tokenizers, one of each
architecture we ship (Llama; Qwen2 with a padded head; Gemma-3 with a sliding window of 4, so
branches and rollbacks cross the window). Tolerance: float32, atol 1e-4 on logits of scale ~1.
"""

from __future__ import annotations

import random

import pytest
import torch

from ensemble_core.errors import ConfigError
from ensemble_core.members.hf_backend import HFBackend, attention_windows
from ensemble_core.members.token_tree import TokenTree
from reference import ATOL, uncached_next_logits

ARCHS = ["tiny-llama", "tiny-qwen2", "tiny-gemma3"]


def random_ids(rng: random.Random, member, count: int) -> list[int]:
    return [rng.randrange(100, len(member.table)) for _ in range(count)]


def tree_for(member, prompts: dict[int, list[int]]) -> TokenTree:
    return TokenTree(HFBackend(member.model, pad_token_id=0), prompts)


def assert_node_matches(member, node) -> None:
    torch.testing.assert_close(node.logits, uncached_next_logits(member.model, node.ids()), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_history_moves_branches_and_rollbacks_match_uncached(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(1)
    tree = tree_for(member, {7: random_ids(rng, member, 5)})
    for _ in range(30):
        head = tree.head(7)
        branches = [tree.path(head, random_ids(rng, member, rng.randint(1, 3))) for _ in range(rng.randint(0, 3))]
        for node in [head, *branches]:
            tree.want(node)
        tree.evaluate()
        for node in [head, *branches]:
            assert_node_matches(member, node)
        move = rng.random()
        if move < 0.5 and branches:  # a branch becomes history (a draft was committed)
            tree.set_head(7, rng.choice(branches))
        elif move < 0.8:
            tree.set_head(7, tree.path(head, random_ids(rng, member, rng.randint(1, 4))))
        else:  # roll back a few tokens (re-encoding a tail)
            history = tree.row(7).history
            tree.set_head(7, history[max(0, len(history) - rng.randint(2, 6))])
        tree.prune(7)
    assert tree.stats.forwards <= 31  # one evaluation per round at most


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_of_different_lengths_with_different_moves_match_one_at_a_time(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(3)
    tree = tree_for(member, {key: random_ids(rng, member, n) for key, n in ((10, 3), (20, 9), (30, 5))})
    for _ in range(20):
        for key in (10, 20, 30):
            tree.want(tree.head(key))
        tree.evaluate()
        for key in (10, 20, 30):
            assert_node_matches(member, tree.head(key))
        for key in (10, 20, 30):  # every row does something different: dead columns appear
            history = tree.row(key).history
            if rng.random() < 0.7:
                tree.set_head(key, tree.path(tree.head(key), random_ids(rng, member, rng.randint(1, 4))))
            else:
                tree.set_head(key, history[max(0, len(history) - rng.randint(2, 4))])
            tree.prune(key)
    tree.drop([20])  # a finished request leaves; the others continue unchanged
    for key in (10, 30):
        tree.set_head(key, tree.path(tree.head(key), random_ids(rng, member, 2)))
        tree.want(tree.head(key))
    tree.evaluate()
    for key in (10, 30):
        assert_node_matches(member, tree.head(key))


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-gemma3"])
def test_dead_columns_are_squeezed_out_and_nothing_changes(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    rng = random.Random(4)
    tree = tree_for(member, {1: random_ids(rng, member, 4), 2: random_ids(rng, member, 6)})
    backend = tree.backend
    widest = 0
    for _ in range(40):  # wide throwaway branches every step leave many dead columns behind
        for key in (1, 2):
            head = tree.head(key)
            for _ in range(6):
                tree.want(tree.path(head, random_ids(rng, member, 3)))
        tree.evaluate()
        widest = max(widest, backend.columns)
        for key in (1, 2):
            tree.set_head(key, tree.path(tree.head(key), random_ids(rng, member, 1)))
            tree.prune(key)
    for key in (1, 2):
        tree.want(tree.head(key))
    tree.evaluate()
    for key in (1, 2):
        assert_node_matches(member, tree.head(key))
    live = max(len(tree.row(k).history) for k in (1, 2))
    assert backend.columns < live + 64 + 3 * 6 + 1 < 40 * 19  # compacted, far below all columns ever used
    assert widest >= backend.columns


def test_forgotten_logits_are_computed_again_when_wanted(tiny_member) -> None:
    member = tiny_member("tiny-llama")
    rng = random.Random(5)
    tree = tree_for(member, {1: random_ids(rng, member, 4)})
    for _ in range(20):  # long enough that early history nodes forget their logits
        tree.set_head(1, tree.path(tree.head(1), random_ids(rng, member, 1)))
        tree.want(tree.head(1))
        tree.evaluate()
    early = tree.row(1).history[5]
    assert early.logits is None
    tree.set_head(1, early)  # a rollback far back
    tree.want(early)
    tree.evaluate()
    assert_node_matches(member, early)


def test_sliding_windows_are_counted_in_positions_not_columns(tiny_member) -> None:
    member = tiny_member("tiny-gemma3")
    assert attention_windows(member.model.config) == {"sliding_attention": 4, "full_attention": None}
    rng = random.Random(6)
    tree = tree_for(member, {1: random_ids(rng, member, 3), 2: random_ids(rng, member, 12)})
    # Row 1 gains dead columns in the middle of its window (a throwaway branch per step).
    for _ in range(6):
        for key in (1, 2):
            tree.want(tree.path(tree.head(key), random_ids(rng, member, 2)))
            tree.set_head(key, tree.path(tree.head(key), random_ids(rng, member, 1)))
            tree.want(tree.head(key))
        tree.evaluate()
        for key in (1, 2):
            assert_node_matches(member, tree.head(key))  # exact although the row's slots are not contiguous
            tree.prune(key)


def test_empty_prompts_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least one prompt"):
        TokenTree(object(), {})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Prompt 3 has no tokens"):
        TokenTree(object(), {3: []})  # type: ignore[arg-type]
