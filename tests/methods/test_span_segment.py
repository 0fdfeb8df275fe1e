"""SweetSpan and SpecFuse/SpecEM on the real packaged models: a forced winner, one-forward
scoring, three families, exit of a random-weight member. (Argument checks: test_arguments.py;
twins: test_twins.py; selection rules on hand-made scores: test_rules.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import packaged_member

from ensemble_core import Ensemble
from ensemble_core.members.contract import Boundary, Candidate, RequestId
from ensemble_core.methods import Single, SpecFuse, SweetSpan
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix
from reference import uncached_all_logits

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
PROMPTS = ["Once upon a time, in a small village,", "def fibonacci(n):\n"]
CJK_PROMPT = (
    "English: Good morning, my friend! 🙂\nChinese: 早上好，我的朋友！🙂\nEnglish: The weather is nice.\nChinese:"
)
pytestmark = pytest.mark.packaged


class AlwaysGemma(SpecFuse):
    """A stub selection: Gemma's candidate wins every round."""

    def start(self, binding, settings, device):
        run = super().start(binding, settings, device)

        def select(state, row, candidates, scores) -> int:
            return next(i for i, c in enumerate(candidates) if 2 in c.proposers)

        run.select = select  # type: ignore[method-assign]
        return run


def test_a_member_that_always_wins_gives_its_own_greedy_output(float32_members) -> None:
    """float32: in bf16 a forward whose cache holds other members' scored candidates (masked)
    rounds differently from the plain one-token forward of a model alone."""
    members = float32_members
    alone = Ensemble(members, method=Single(member=GEMMA)).generate(PROMPTS[0], max_new_tokens=24)
    forced = Ensemble(members, method=AlwaysGemma(exit=False)).generate(PROMPTS[0], max_new_tokens=24)
    assert forced.token_ids[GEMMA] == alone.token_ids[GEMMA]
    assert forced.text == alone.text


@pytest.mark.parametrize("index", [0, 1, 2], ids=["qwen2", "llama", "gemma3"])
def test_one_forward_scores_equal_fresh_forwards_per_candidate(index: int) -> None:
    """float32, atol 5e-4 on log-probabilities, on the three packaged architectures."""
    member = packaged_member((QWEN, SMOL, GEMMA)[index], "float32")
    prompt = member.render("The old lighthouse keeper looked at the sea and")
    request = RequestId(1)
    session = member.start({request: prompt}, Boundary.RETOKENIZE)
    session.next([request])
    texts = [b" smiled.", b" said nothing at all", " 看见了一艘船 🙂".encode()]
    [scores] = session.score([request], [[Candidate(t) for t in texts]])
    for text, score in zip(texts, scores, strict=True):
        candidate = member.vocab.encode(text)
        logprobs = uncached_all_logits(member.model, prompt.ids + candidate).float().log_softmax(-1)
        expected = torch.stack([logprobs[len(prompt.ids) - 1 + j, t] for j, t in enumerate(candidate)])
        torch.testing.assert_close(score.values, expected, atol=5e-4, rtol=0)


@pytest.mark.parametrize("method", [SweetSpan(), SpecFuse(hedge_eta=1.0)], ids=["sweetspan", "specem"])
def test_three_families_greedy_sampled_stop_and_non_ascii(method) -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    ensemble = Ensemble(members, method=method)
    greedy = ensemble.generate(CJK_PROMPT, max_new_tokens=16)
    data = greedy.data
    data[: len(data) - incomplete_utf8_suffix(data)].decode("utf-8")  # strict: nothing garbled
    assert any(ord(ch) > 0x2E80 for ch in greedy.text), greedy.text
    for member in members:
        assert member.table.spell(greedy.token_ids[member.name]) == data
    rounds = greedy.stats.method_stats.per_round
    assert rounds and all(r.winner for r in rounds)
    sampled = [ensemble.generate(CJK_PROMPT, max_new_tokens=10, temperature=0.7, seed=3) for _ in range(2)]
    assert sampled[0].text == sampled[1].text
    # A draft ends at a stop string, so a candidate holding one is scored shorter and the
    # winner can differ from the run without it: what must hold is the stop itself.
    stopped = ensemble.generate(CJK_PROMPT, max_new_tokens=16, stop=["\n", "朋友"])
    assert stopped.finish_reason == "stop"
    assert "\n" not in stopped.text and "朋友" not in stopped.text
    assert stopped.text.strip()


def test_a_random_weight_member_exits_after_the_warm_up(tiny_member) -> None:
    noise = tiny_member("tiny-llama")  # SmolLM2's real tokenizer, random weights
    members = [packaged_member(QWEN), packaged_member(SMOL), noise]
    result = Ensemble(members, method=SpecFuse(exit_warmup=2)).generate(PROMPTS[0], max_new_tokens=48)
    stats = result.stats.method_stats
    assert "tiny-llama" in stats.exited and QWEN not in stats.exited  # the best member always drafts
    rounds = stats.per_round
    assert all("tiny-llama" in r.drafters for r in rounds[:2])  # drafts during the warm-up
    assert all("tiny-llama" not in r.drafters for r in rounds[3:])  # then never again
    assert all("tiny-llama" not in r.winner for r in rounds)
