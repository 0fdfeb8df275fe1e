"""Sampling, defined once: greedy argmax, seeded draws, top-p on what is drawn from."""

from __future__ import annotations

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.sampling import draw, row_generator, top_p_filter


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    torch.testing.assert_close(top_p_filter(probs, 0.8), torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))
    assert (top_p_filter(probs, 0.81) > 0).sum() == 3
    torch.testing.assert_close(top_p_filter(probs * 3, 1.0), probs)  # unnormalised input: made a distribution


def test_greedy_is_argmax_and_sampling_is_reproducible_with_a_seed() -> None:
    probs = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 0.5, -1)
    assert draw(probs, GenerationSettings(), None) == int(probs.argmax())
    hot = GenerationSettings(temperature=1.5, seed=7)
    first = [draw(probs, hot, gen) for gen in [row_generator(hot)] for _ in range(20)]
    again = [draw(probs, hot, gen) for gen in [row_generator(hot)] for _ in range(20)]
    assert first == again
    assert len(set(first)) > 5  # a flat distribution over 1000 entries really samples
    narrow = GenerationSettings(temperature=1.0, top_p=0.05, seed=1)
    kept = top_p_filter(probs, 0.05) > 0
    assert all(kept[draw(probs, narrow, gen)] for gen in [row_generator(narrow)] for _ in range(20))


def test_a_tiny_temperature_is_near_greedy_not_nan() -> None:
    """Found by the random-settings test: logits / 5e-207 overflowed (and a float32 temperature
    that small is 0), so softmax gave nan and sampling failed."""
    from ensemble_core.sampling import tempered

    logits = torch.tensor([1.0, 3.0, 2.0, float("-inf")])
    for temperature in (4.98e-207, 1e-45, 1e-5):
        assert torch.softmax(tempered(logits, temperature), dim=-1).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert torch.equal(tempered(logits, 0.7), logits / 0.7)  # above 0.01: exactly transformers' division
