"""Sampling, defined once for every method.

* **Temperature** scales each member's logits: a member's distribution is softmax(logits / T)
  (its session computes it; `MemberSession.next(..., temperature)`). Greedy decoding (T = 0)
  combines the members' distributions at T = 1 and takes the argmax.
* **Top-p** applies once, to the distribution something is actually drawn from: the ensemble's
  combined distribution for GaC and UniTE, a member's own distribution when it draws alone
  (`Single`, the gate's confident steps, a SAFE or span drafter), SAFE's combined target when it
  resamples. Member distributions that are only combined are never cut.
* **Seeds**: each prompt gets its own generator, seeded with `seed`, so a prompt's text does not
  depend on what else is in its batch.
"""

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


def temperature_of(settings: GenerationSettings) -> float:
    """The temperature member distributions are computed at (1 when greedy)."""
    return 1.0 if settings.greedy else settings.temperature


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature (unchanged at 0, greedy, and 1). Below 0.01 the logits are first
    shifted by their maximum, in float64: divided as they are, they overflow to inf (and a
    float32 temperature can round to 0), and softmax of inf - inf is nan; shifted, the best
    stays 0 and the rest go to -inf, so a tiny temperature is the near-greedy distribution it
    means. Above, the division is transformers' own."""
    if temperature in (0.0, 1.0):
        return logits
    if temperature < 0.01:  # (in float64: a float32 temperature below ~1e-45 is 0)
        return ((logits.double() - logits.max()) / temperature).to(logits.dtype)
    return logits / temperature


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely entries whose mass reaches `top_p`, renormalised."""
    total = probs.sum()
    if top_p >= 1.0:
        return probs / total
    ordered, order = torch.sort(probs / total, descending=True)
    before = torch.cumsum(ordered, dim=-1) - ordered  # mass of strictly more likely entries
    ordered[before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, ordered)
    return kept / kept.sum()


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One index drawn from a 1-D probability vector with a seeded generator."""
    return int(torch.multinomial(probs.to(generator.device, torch.float32), 1, generator=generator))


def draw(probs: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None) -> int:
    """An index of a 1-D distribution: its argmax when greedy, else a seeded sample after top-p.

    Greedy ties go to the lowest index (what `torch.argmax` and `generate` do).
    """
    if settings.greedy or generator is None:
        return int(torch.argmax(probs))
    return sample(top_p_filter(probs.float(), settings.top_p), generator)


def uniform(generator: torch.Generator) -> float:
    """A seeded draw from U[0, 1) (speculative sampling's acceptance test)."""
    return float(torch.rand((), generator=generator, device=generator.device))
