"""One model twice is that model alone: for every method, many prompts, several lengths.

A second copy of a member changes nothing it would write: it agrees at every position, so
every method must reproduce the model's own greedy text and ids exactly. Rounds end in
different places for different lengths (draft budgets, confident drafts, spans cut by the
limit), which is where SAFE once went wrong: a verifier re-encoded text ending in "\\n" and
no longer conditioned on what the model itself had written.

Tiny random-weight float32 models (three architectures, three real tokenizers) write odd text
full of whitespace runs, byte pieces and rare tokens: hard cases, in milliseconds. Then the
real SmolLM2 in float32 (SAFE's verifier reads drafts in multi-token forwards, which bf16
rounds differently from one-token forwards), on the prompt of the original report, also with
`boundary="retokenize"`. Random models are not checked in that mode: there a verifier reads a
draft in its tokenizer's own tokens, and a random model writes byte-fallback ids its tokenizer
never would (a trained model writes what its tokenizer writes, so the real one is exact).
"""

from __future__ import annotations

import pytest
from conftest import packaged_member

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import SAFE, Contrastive, GaC, Single, SpecFuse, SweetSpan, UniTE

METHODS = {
    "gac": GaC(),
    "unite": UniTE(),
    "gate": GaC(threshold=0.5),
    "safe": SAFE(),
    "safe-one": SAFE(draft_len=1),
    "safe-all": SAFE(confident_drafts=None),
    "sweetspan": SweetSpan(),
    "specfuse": SpecFuse(segment_tokens=4),
    "contrastive": Contrastive(),
}
PROMPTS = ["def add(a, b):\n    ", "The capital of France is", "你好，世界！\n\n", "Once upon a time,"]


def twin(member: HFMember) -> HFMember:
    return HFMember(member.model, member.tokenizer, name=member.name + "-twin")


def assert_twins_equal_alone(member: HFMember, method, boundary: str, prompt: str, tokens: int) -> None:
    alone = Ensemble([member], method=Single(), boundary=boundary).generate(prompt, max_new_tokens=tokens)
    together = Ensemble([member, twin(member)], method=method, boundary=boundary).generate(
        prompt, max_new_tokens=tokens
    )
    assert together.text == alone.text
    assert together.token_ids[member.name] == alone.token_ids[member.name]
    assert together.token_ids[member.name + "-twin"] == alone.token_ids[member.name]


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
@pytest.mark.parametrize("name", list(METHODS))
def test_tiny_twins_equal_the_model_alone(arch: str, name: str, tiny_member) -> None:
    member = tiny_member(arch)
    first = (list(METHODS).index(name) + len(arch)) % len(PROMPTS)  # every prompt, across the matrix
    for prompt in (PROMPTS[first], PROMPTS[(first + 1) % len(PROMPTS)]):
        for tokens in (7, 23):
            assert_twins_equal_alone(member, METHODS[name], "correct", prompt, tokens)


@pytest.mark.packaged
@pytest.mark.parametrize("name", list(METHODS))
def test_smollm2_twins_equal_smollm2_alone(name: str) -> None:
    smol = packaged_member("smollm2-135m-instruct", "float32")
    assert_twins_equal_alone(smol, METHODS[name], "correct", "The capital of France is", 20)
    if name.startswith("safe"):
        assert_twins_equal_alone(smol, METHODS[name], "retokenize", "The capital of France is", 20)
        chat = [{"role": "user", "content": "Write a haiku about the sea."}]
        assert_twins_equal_alone(smol, METHODS[name], "correct", chat, 16)
