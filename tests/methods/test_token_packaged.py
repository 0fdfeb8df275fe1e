"""GaC, UniTE, SAFE and the gate on the REAL packaged models: three tokenizer families."""

from __future__ import annotations

import pytest
from conftest import packaged_member

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import SAFE, GaC, Single, UniTE
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
RAW_PROMPTS = ["Once upon a time, in a small village,", "def fibonacci(n):\n", "The capital of France is"]
CJK_PROMPT = (
    "English: Good morning, my friend! 🙂\nChinese: 早上好，我的朋友！🙂\nEnglish: The weather is nice today.\nChinese:"
)
pytestmark = pytest.mark.packaged


def twin(member: HFMember) -> HFMember:
    """The same weights and tokenizer under another name (no second copy in memory)."""
    return HFMember(member.model, member.tokenizer, name=member.name + "-twin")


def test_one_sided_weights_reproduce_that_member_exactly() -> None:
    """Byte-level BPE beside SentencePiece: each member alone at weight 1 writes its own text."""
    names = (QWEN, GEMMA)
    members = [packaged_member(n) for n in names]
    prompt = RAW_PROMPTS[0]
    for weights, follow in (((1, 0), 0), ((0, 1), 1)):
        alone = Ensemble(members, method=Single(member=names[follow])).generate(prompt, max_new_tokens=20)
        result = Ensemble(members, method=GaC(weights=weights)).generate(prompt, max_new_tokens=20)
        assert result.token_ids[names[follow]] == alone.token_ids[names[follow]], weights
        assert result.text == alone.text


def test_the_gate_consults_the_others_only_when_the_primary_is_unsure() -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    prompt = RAW_PROMPTS[0]
    result = Ensemble(members, method=GaC(threshold=0.5, primary="qwen")).generate(prompt, max_new_tokens=20)
    stats = result.stats.method_stats
    assert 0 < stats.ensembled_steps < stats.steps
    for name in (SMOL, GEMMA):
        member_stats = result.stats.members[name]
        # One forward per ensembled step (the catch-up included), never token by token...
        assert member_stats.forwards == stats.ensembled_steps
        # ...and no re-prefill: each prompt or reply token (or covering node) is forwarded about once.
        prompt_tokens = len(packaged_member(name).render(prompt).ids)
        assert member_stats.forwarded_tokens <= 3 * (prompt_tokens + len(result.token_ids[name]) + 8)


def test_safe_skips_lose_nothing_and_where_drafts_end_changes_nothing(float32_members) -> None:
    """Skipping is exact (the skipped piece IS the ensemble's argmax), and every decision depends
    only on the text before it, so ending drafts early (`confident_drafts`) changes no text
    (on real models here; tests/methods/test_safe_rounds.py varies the round shapes more widely)."""
    prompt = RAW_PROMPTS[1]  # code: the prompt-end correction is in play
    members = float32_members
    base = {"drafter": "qwen", "sharpen": None}
    texts = {
        (skip, confident): Ensemble(members, method=SAFE(skip_tests=skip, confident_drafts=confident, **base))
        .generate(prompt, max_new_tokens=16)
        .text
        for skip, confident in ((True, 0.5), (True, None), (False, 0.5))
    }
    assert len(set(texts.values())) == 1, texts


@pytest.mark.parametrize(
    "method", [GaC(), UniTE(), SAFE(drafter="qwen"), GaC(threshold=0.5)], ids=["gac", "unite", "safe", "gate"]
)
def test_three_tokenizer_families_greedy_sampled_stop_and_non_ascii(method) -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    ensemble = Ensemble(members, method=method)
    greedy = ensemble.generate(CJK_PROMPT, max_new_tokens=16)
    data = greedy.data
    complete = data[: len(data) - incomplete_utf8_suffix(data)]
    complete.decode("utf-8")  # strict: no garbled bytes anywhere
    assert any(ord(ch) > 0x2E80 for ch in greedy.text), greedy.text  # it did write CJK
    for member in members:  # every member's own ids spell exactly the committed text
        assert member.table.spell(greedy.token_ids[member.name]) == data
    sampled = [ensemble.generate(CJK_PROMPT, max_new_tokens=8, temperature=0.8, top_p=0.95, seed=5) for _ in range(2)]
    assert sampled[0].text == sampled[1].text
    stop = next(w for w in greedy.text.split() if len(w) >= 3)[1:3]
    stopped = ensemble.generate(CJK_PROMPT, max_new_tokens=16, stop=[stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == greedy.text[: greedy.text.index(stop)]


def test_safe_never_splits_a_character_by_sharpening_onto_its_lead_byte() -> None:
    """Byte-level vocabularies have a token for every UTF-8 lead byte; sharpening once moved the
    mass of every CJK character onto that byte and committed half a character ('佱' for '你')."""
    qwen, smol = packaged_member(QWEN), packaged_member(SMOL)
    prompt = [
        {"role": "user", "content": "Create a customer named '你好啊集团' (Hello Group). Reply with the name only."}
    ]
    alone = Ensemble([qwen], method="single").generate(prompt, max_new_tokens=12).text
    assert "你好啊集团" in alone
    for params in ({"drafter": "qwen"}, {"drafter": "qwen", "skip_tests": False}):
        together = Ensemble([qwen, smol], method="safe", method_params=params).generate(prompt, max_new_tokens=12)
        assert "你好啊集团" in together.text, together.text


def test_safe_lets_the_ensemble_decide_where_the_drafter_proposes_a_control_token() -> None:
    """After five tool rounds Qwen drafts `<|im_start|>`, which has no text and no union entry;
    SAFE used to score it and fail with an IndexError."""
    qwen, smol = packaged_member(QWEN), packaged_member(SMOL)
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": "multiply", "description": "Multiply.", "parameters": parameters}}
    messages = [
        {"role": "system", "content": "You are a calculator. Use the multiply tool."},
        {"role": "user", "content": "What is 6 times 7?"},
    ]
    a = 6
    for i in range(5):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": 7}}}
        a *= 7
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": str(a), "tool_call_id": f"c{i}"},
        ]
    control = qwen.tokenizer.convert_tokens_to_ids("<|im_start|>")
    alone = Ensemble([qwen], method="single").generate(messages, tools=[tool], max_new_tokens=32)
    assert alone.token_ids[qwen.name][0] == control  # what Qwen drafts first here
    result = Ensemble([qwen, smol], method="safe", method_params={"drafter": "qwen"}).generate(
        messages, tools=[tool], max_new_tokens=32
    )
    # The ensemble decided that position (SmolLM2 has no such token; the control token spells no
    # text, so it has no union entry): the reply goes on in text, every member's ids spelling it.
    assert result.text.strip() and control not in result.token_ids[qwen.name]
    for member in (qwen, smol):
        assert member.table.spell(result.token_ids[member.name]) == result.data
