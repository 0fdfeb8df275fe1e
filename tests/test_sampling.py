"""Greedy, temperature and top-p choices."""

from __future__ import annotations

import torch

from ensemble_core.config import GenerationSettings
from ensemble_core.sampling import choose_token, row_generator, sampling_probs


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = sampling_probs(logits, GenerationSettings(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))
    probs = sampling_probs(logits, GenerationSettings(temperature=1.0, top_p=0.81))
    assert (probs > 0).sum() == 3


def test_greedy_is_argmax_and_sampling_is_reproducible_with_a_seed() -> None:
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert choose_token(logits, GenerationSettings(), None) == int(logits.argmax())
    hot = GenerationSettings(temperature=1.5, seed=7)
    first = [choose_token(logits, hot, gen) for gen in [row_generator(hot)] for _ in range(20)]
    again = [choose_token(logits, hot, gen) for gen in [row_generator(hot)] for _ in range(20)]
    assert first == again
    assert len(set(first)) > 5  # a hot distribution over 1000 tokens really samples
