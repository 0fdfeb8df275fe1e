"""Reference computations the tests compare against: plain uncached forwards."""

from __future__ import annotations

import copy

import torch

from ensemble_core import HFMember

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


def text_greedy_generate(member, ids: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding by TEXT, from uncached forwards: each step the text with the most mass
    (all ids spelling it, and all end ids together, added up; ties to the top id's text),
    written with its likeliest id. The documented own-choice rule, computed independently of
    the member's caches and trees. It is transformers' `generate` wherever no two ids spelling
    one text outweigh the top id, which random models violate often and trained ones rarely."""
    spelled = member.table.token_bytes
    keys: dict[object, int] = {}
    key_of = torch.tensor(
        [
            keys.setdefault("end" if t in member.eos_token_ids else b if b is not None else ("control", t), len(keys))
            for t, b in enumerate(spelled)
        ]
    )
    names = list(keys)
    out: list[int] = []
    for _ in range(new_tokens):
        probs = torch.softmax(uncached_next_logits(member.model, ids + out).float(), dim=-1)[: len(spelled)]
        masses = torch.zeros(len(keys)).index_add_(0, key_of, probs)
        top_key = int(key_of[int(torch.argmax(probs))])
        best = top_key if float(masses[top_key]) == float(masses.max()) else int(torch.argmax(masses))
        if names[best] == "end":
            break
        members_of_best = torch.nonzero(key_of == best).flatten()
        out.append(int(members_of_best[int(torch.argmax(probs[members_of_best]))]))
    return out


def endless(member: HFMember) -> HFMember:
    """The tiny model, decisive and never ending: a random model is nearly uniform (logits with
    a spread of ~0.1), so its several end ids added up often win the first step; these tests
    want the lengths they ask for. Output rows x30, and zero rows (logit 0) for the end ids."""
    model = copy.deepcopy(member.model)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(30.0)
        head[sorted(member.eos_token_ids)] = 0.0
    return HFMember(model, member.tokenizer, name=member.name)
