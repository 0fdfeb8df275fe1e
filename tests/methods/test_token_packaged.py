"""GaC, UniTE and SAFE on the REAL packaged models: three tokenizer families."""

from __future__ import annotations

import pytest
import torch
from conftest import packaged_member

from ensemble_core import Ensemble, HFMember
from ensemble_core.members.text_sync import incomplete_utf8_suffix
from ensemble_core.methods import SAFE, GaC, Single, UniTE
from ensemble_core.methods.combine import Combiner
from ensemble_core.methods.token import union_for
from reference import uncached_next_logits

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
RAW_PROMPTS = ["Once upon a time, in a small village,", "def fibonacci(n):\n", "The three primary colours are"]
CJK_PROMPT = (
    "English: Good morning, my friend! 🙂\nChinese: 早上好，我的朋友！🙂\nEnglish: The weather is nice today.\nChinese:"
)
pytestmark = pytest.mark.packaged


def twin(member: HFMember) -> HFMember:
    """The same weights and tokenizer under another name (no second copy in memory)."""
    return HFMember(member.model, member.tokenizer, name=member.name + "-twin")


@pytest.mark.parametrize("method", [GaC(), UniTE(), SAFE()], ids=["gac", "unite", "safe"])
@pytest.mark.parametrize("prompt", RAW_PROMPTS)
def test_the_same_model_twice_equals_that_model_alone(method, prompt: str, float32_members) -> None:
    # GaC and UniTE run every member token by token, exactly as the model alone does, so even
    # bf16 matches bit for bit. SAFE's verifier reads the draft in one multi-token forward, and
    # bf16 results depend on that shape (ALGORITHMS.md section 8), so SAFE is compared in float32.
    smol = float32_members[1] if isinstance(method, SAFE) else packaged_member(SMOL)
    alone = Ensemble([smol], method=Single()).generate(prompt, max_new_tokens=64)
    together = Ensemble([smol, twin(smol)], method=method).generate(prompt, max_new_tokens=64)
    assert together.token_ids[smol.name] == alone.token_ids[smol.name]
    assert together.token_ids[smol.name + "-twin"] == alone.token_ids[smol.name]
    assert together.text == alone.text and together.finish_reason == alone.finish_reason


@pytest.mark.parametrize("names", [(QWEN, SMOL), (QWEN, GEMMA)], ids=["qwen+smol", "qwen+gemma"])
def test_one_sided_weights_reproduce_that_member_exactly(names) -> None:
    members = [packaged_member(n) for n in names]
    prompt = RAW_PROMPTS[0]
    for weights, follow in (((1, 0), 0), ((0, 1), 1)):
        alone = Ensemble(members, method=Single(member=names[follow])).generate(prompt, max_new_tokens=40)
        result = Ensemble(members, method=GaC(weights=weights)).generate(prompt, max_new_tokens=40)
        assert result.token_ids[names[follow]] == alone.token_ids[names[follow]], weights
        assert result.text == alone.text


def test_the_gate_consults_the_others_only_when_the_primary_is_unsure() -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    prompt = RAW_PROMPTS[0]
    result = Ensemble(members, method=GaC(threshold=0.5, primary="qwen")).generate(prompt, max_new_tokens=40)
    stats = result.stats.method_stats
    assert 0 < stats["ensembled_steps"] < stats["steps"]
    for name in (SMOL, GEMMA):
        member_stats = result.stats.members[name]
        # One forward per ensembled step (the catch-up included), never token by token...
        assert member_stats.forwards == stats["ensembled_steps"]
        # ...and no re-prefill: each prompt or generated token is forwarded about once.
        prompt_tokens = len(packaged_member(name).render(prompt))
        assert member_stats.forwarded_tokens <= prompt_tokens + len(result.token_ids[name]) + 4


# ---------------------------------------------------------------------- SAFE against a reference


def reference_argmax(members: list[HFMember], contexts: dict[str, list[int]]) -> bytes:
    """Full-union GaC argmax from plain uncached forwards over the recorded contexts."""
    combiner = Combiner(union_for(members), [1 / len(members)] * len(members))
    probs = {
        i: torch.softmax(uncached_next_logits(m.model, contexts[m.name]).float(), -1) for i, m in enumerate(members)
    }
    full = combiner.full(probs)
    top2 = torch.topk(full, 2).values
    assert float(top2[0] - top2[1]) > 1e-4, "a near-tie: float32 noise could decide it"
    return combiner.union.entries[int(torch.argmax(full))]


def test_safe_skips_only_where_the_ensemble_argmax_is_the_drafted_token(float32_members) -> None:
    ensemble = Ensemble(float32_members, method=SAFE(drafter="qwen", record=True))
    result = ensemble.generate(RAW_PROMPTS[0], max_new_tokens=40)
    skipped = [d for d in result.stats.method_stats["decisions"] if d["decision"].startswith("skipped")]
    assert skipped
    for decision in skipped:
        assert reference_argmax(float32_members, decision["contexts"]) == decision["draft"]


def test_safe_without_skip_tests_decides_every_position_like_gac(float32_members) -> None:
    method = SAFE(drafter="qwen", skip_tests=False, sharpen=None, record=True)
    result = Ensemble(float32_members, method=method).generate(RAW_PROMPTS[0], max_new_tokens=24)
    decisions = result.stats.method_stats["decisions"]
    ensembled = [d for d in decisions if d["decision"] == "ensembled"]
    assert ensembled and all(d["decision"] in ("ensembled", "oov_like") for d in decisions)
    for decision in ensembled:
        assert reference_argmax(float32_members, decision["contexts"]) == decision["chosen"]


# ---------------------------------------------------------------------- three families together


def first_multi_char_token(member: HFMember, ids: list[int]) -> str:
    for token in ids:
        text = (member.table.token_bytes[token] or b"").decode("utf-8", errors="ignore").strip()
        if len(text) >= 4 and text.isalpha():
            return text[1:3]  # strictly inside the token
    raise AssertionError("no token of four letters in the output")


@pytest.mark.parametrize(
    "method", [GaC(), UniTE(), SAFE(drafter="qwen"), GaC(threshold=0.5)], ids=["gac", "unite", "safe", "gate"]
)
def test_three_tokenizer_families_greedy_sampled_stop_and_non_ascii(method) -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    ensemble = Ensemble(members, method=method)
    greedy = ensemble.generate(CJK_PROMPT, max_new_tokens=24)
    data = greedy.data
    complete = data[: len(data) - incomplete_utf8_suffix(data)]
    complete.decode("utf-8")  # strict: no garbled bytes anywhere
    assert any(ord(ch) > 0x2E80 for ch in greedy.text), greedy.text  # it did write CJK
    for member in members:  # every member's own ids spell exactly the committed text
        assert member.table.spell(greedy.token_ids[member.name]) == data
    sampled = [ensemble.generate(CJK_PROMPT, max_new_tokens=16, temperature=0.8, top_p=0.95, seed=5) for _ in range(2)]
    assert sampled[0].text == sampled[1].text
    stop = first_multi_char_token(members[0], greedy.token_ids[QWEN])
    stopped = ensemble.generate(CJK_PROMPT, max_new_tokens=24, stop=[stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == greedy.text[: greedy.text.index(stop)]


def test_safe_never_splits_a_character_by_sharpening_onto_its_lead_byte() -> None:
    """Byte-level vocabularies have a token for every UTF-8 lead byte; sharpening once moved the
    mass of every CJK character onto that byte and committed half a character ('佱' for '你')."""
    qwen, smol = packaged_member("qwen2.5-coder-0.5b-instruct"), packaged_member("smollm2-135m-instruct")
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
    qwen, smol = packaged_member("qwen2.5-coder-0.5b-instruct"), packaged_member("smollm2-135m-instruct")
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
    assert result.text.startswith("<tool_call>")
    assert control not in result.token_ids[qwen.name]
