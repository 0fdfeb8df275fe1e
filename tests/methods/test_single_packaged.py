"""Single on the REAL packaged models (bf16) equals transformers' own greedy `generate`
(`boundary="retokenize"`, and for chat prompts also with the default boundary correction)."""

from __future__ import annotations

import pytest
from conftest import PACKAGED, packaged_member

from ensemble_core import Ensemble
from ensemble_core.methods import Single
from reference import hf_greedy_generate

CHAT_PROMPTS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Translate to French: the cat sleeps on the warm windowsill. 猫"}],
]
RAW_PROMPTS = [
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "The three primary colours are",
]


def prompts_for(name: str) -> list:
    return CHAT_PROMPTS if packaged_member(name).tokenizer.chat_template else RAW_PROMPTS


@pytest.mark.packaged
@pytest.mark.parametrize("name", PACKAGED)
@pytest.mark.parametrize("prompt_index", [0, 1, 2])
def test_greedy_single_equals_hf_generate_token_for_token(name: str, prompt_index: int) -> None:
    member = packaged_member(name)
    prompt = prompts_for(name)[prompt_index]
    ensemble = Ensemble([member], method=Single(), boundary="retokenize")
    result = ensemble.generate(prompt, max_new_tokens=24)
    expected = hf_greedy_generate(member, member.render(prompt).ids, 24)
    ours = result.token_ids[member.name]
    if result.finish_reason == "eos":
        ours = [*ours, expected[len(ours)]]
        assert expected[len(ours) - 1] in member.eos_token_ids
    assert ours == expected
    assert result.usage.completion_tokens == len(expected)
    if prompt_index == 0:  # streaming shares the decode loop: one prompt per model shows it
        streamed = list(ensemble.stream(prompt, max_new_tokens=24))
        assert "".join(c.text for c in streamed) == result.text
        assert streamed[-1].result is not None and streamed[-1].result.token_ids == result.token_ids
    if not isinstance(prompt, str):  # a chat prompt ends at its template: nothing to re-read
        corrected = Ensemble([member], method=Single()).generate(prompt, max_new_tokens=24)
        assert corrected.token_ids == result.token_ids
