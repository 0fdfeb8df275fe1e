"""Choosing the next token from a distribution: greedy, or seeded temperature/top-p sampling."""

from __future__ import annotations

import torch

from ensemble_core.config import GenerationSettings


def row_generator(settings: GenerationSettings, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator for one prompt: seeded with `settings.seed` (or randomly), None when greedy."""
    if settings.greedy:
        return None
    generator = torch.Generator(device=device)
    if settings.seed is None:
        generator.seed()
    else:
        generator.manual_seed(settings.seed)
    return generator


def sampling_probs(logits: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """Float32 probabilities after temperature and top-p, for a 1-D logits vector."""
    probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
    if settings.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered  # mass of strictly more likely tokens
        ordered[before >= settings.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, ordered)
        probs /= probs.sum()
    return probs


def choose_token(logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None) -> int:
    """The next token id from 1-D logits: argmax when greedy, else a seeded sample."""
    if settings.greedy or generator is None:
        return int(torch.argmax(logits))
    probs = sampling_probs(logits, settings)
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))
