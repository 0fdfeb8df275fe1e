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


def hf_greedy_generate(member, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy `generate` for one prompt, stopping at any of the member's EOS ids."""
    with torch.inference_mode():
        out = member.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=sorted(member.eos_token_ids),
            pad_token_id=member.tokenizer.pad_token_id,
        )
    return out[0, len(ids) :].tolist()


def assert_rows_match_uncached(batch, model: torch.nn.Module) -> torch.Tensor:
    """Every row's cached next-token logits equal an uncached forward over its ids; returns them."""
    logits = batch.next_logits()
    for row in range(batch.batch_size):
        torch.testing.assert_close(logits[row], uncached_next_logits(model, batch.ids(row)), atol=ATOL, rtol=0)
    return logits
