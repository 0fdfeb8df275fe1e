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


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely entries whose mass reaches `top_p`, renormalised."""
    if top_p >= 1.0:
        return probs
    ordered, order = torch.sort(probs, descending=True)
    before = torch.cumsum(ordered, dim=-1) - ordered  # mass of strictly more likely entries
    ordered[before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, ordered)
    return kept / kept.sum()


def sampling_probs(logits: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """Float32 probabilities after temperature and top-p, for a 1-D logits vector."""
    return top_p_filter(torch.softmax(logits.float() / settings.temperature, dim=-1), settings.top_p)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One index drawn from a 1-D probability vector with a seeded generator."""
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))


def choose_token(logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None) -> int:
    """The next token id from 1-D logits: argmax when greedy, else a seeded sample."""
    if settings.greedy or generator is None:
        return int(torch.argmax(logits))
    return sample(sampling_probs(logits, settings), generator)
