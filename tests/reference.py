"""Reference computations the tests compare against: plain uncached forwards."""

from __future__ import annotations

import torch

# float32 tiny models: cached and uncached logits agree to ~1e-6; 1e-4 leaves room for
# different matmul blockings of different shapes.
ATOL = 1e-4


def uncached_next_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Next-token logits after `ids`, from one full forward without any cache."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def uncached_all_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids`, from one full forward without any cache."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]
