"""SweetSpan and SpecFuse/SpecEM: drafting, one-forward scoring, selection, exit, Hedge."""

from __future__ import annotations

import pytest
import torch
from conftest import packaged_member

from ensemble_core import Ensemble, HFMember
from ensemble_core.errors import ConfigError
from ensemble_core.members.kv_batch import KVBatch, ScoreRequest
from ensemble_core.members.text_sync import incomplete_utf8_suffix
from ensemble_core.methods import Single, SpecFuse, SweetSpan
from ensemble_core.methods.drafting import Candidate
from ensemble_core.methods.span import filtered_scores, rank_combined
from reference import uncached_all_logits

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
PROMPTS = ["Once upon a time, in a small village,", "def fibonacci(n):\n"]
CJK_PROMPT = (
    "English: Good morning, my friend! 🙂\nChinese: 早上好，我的朋友！🙂\nEnglish: The weather is nice.\nChinese:"
)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SweetSpan(span_words=0), "span/segment length has to be a positive integer, but is 0"),
        (lambda: SweetSpan(max_span_tokens=0), "token cap has to be a positive integer"),
        (lambda: SweetSpan(unit="lines"), r"`unit` has to be one of \['words', 'tokens'\]"),
        (lambda: SweetSpan(outlier_mad=0), "`outlier_mad` has to be > 0"),
        (lambda: SpecFuse(segment_tokens=0), "token cap has to be a positive integer, but is 0"),
        (lambda: SpecFuse(score="perplexity"), r"`score` has to be one of \['logprob', 'logit'\]"),
        (lambda: SpecFuse(hedge_eta=-0.5), "`hedge_eta` has to be > 0"),
        (lambda: SpecFuse(exit_warmup=-1), "`exit_warmup` has to be a non-negative integer"),
        (lambda: SpecFuse(hedge_eta=1.0, weights=[1, 1]), "either `weights` or `hedge_eta`"),
    ],
)
def test_bad_arguments_are_named(make, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_the_unfaithful_score_filter_and_rank_combination() -> None:
    candidates = [Candidate(b"a", False, {0: [1]}), Candidate(b"b", False, {1: [2]}), Candidate(b"c", False, {2: [3]})]
    scores = {0: [-0.1, -1.0, -2.0], 1: [-1.5, -0.2, -1.0], 2: [-1.2, -0.9, -0.3], 3: [-1.4, -9.0, -1.1]}
    kept = filtered_scores(candidates, scores, self_score=False, outlier_mad=2.0)
    assert 0 not in kept[0] and 1 not in kept[1] and 2 not in kept[2]  # no self-preference
    assert 1 not in kept[3]  # -9.0 is far outside the other scores of candidate "b"
    combined = rank_combined(kept, 3)
    assert max(range(3), key=combined.__getitem__) == 1


@pytest.mark.packaged
@pytest.mark.parametrize("method", [SweetSpan(), SpecFuse()], ids=["sweetspan", "specfuse"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_identical_members_equal_the_model_alone(method, prompt: str) -> None:
    smol = packaged_member(SMOL)
    alone = Ensemble([smol], method=Single()).generate(prompt, max_new_tokens=64)
    twins = [smol, HFMember(smol.model, smol.tokenizer, name="smol-twin")]
    together = Ensemble(twins, method=method).generate(prompt, max_new_tokens=64)
    assert together.token_ids[SMOL] == alone.token_ids[SMOL]
    assert together.token_ids["smol-twin"] == alone.token_ids[SMOL]
    assert together.text == alone.text


class AlwaysGemma(SpecFuse):
    """A stub selection: Gemma's candidate wins every round."""

    def start(self, members, settings):
        run = super().start(members, settings)

        def select(state, row, candidates, scores) -> int:
            return next(i for i, c in enumerate(candidates) if 2 in c.proposers)

        run.select = select  # type: ignore[method-assign]
        return run


@pytest.mark.packaged
def test_a_member_that_always_wins_gives_its_own_greedy_output() -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    alone = Ensemble(members, method=Single(member=GEMMA)).generate(PROMPTS[0], max_new_tokens=48)
    forced = Ensemble(members, method=AlwaysGemma(exit=False)).generate(PROMPTS[0], max_new_tokens=48)
    assert forced.token_ids[GEMMA] == alone.token_ids[GEMMA]
    assert forced.text == alone.text
    weighted = Ensemble(members, method=SweetSpan(self_score=True)).generate(PROMPTS[0], max_new_tokens=16)
    assert weighted.text  # the real selection runs on the same members


@pytest.mark.packaged
@pytest.mark.parametrize("index", [0, 1, 2], ids=["qwen2", "llama", "gemma3"])
def test_one_forward_scores_equal_fresh_forwards_per_candidate(index: int, float32_members) -> None:
    """float32, atol 5e-4 on log-probabilities (the three packaged architectures)."""
    member = float32_members[index]
    prefix = member.render("The old lighthouse keeper looked at the sea and")
    batch = KVBatch(member.model, [prefix])
    batch.next_logits()
    batch.extend(0, member.tokenizer.encode(" a draft that must be ignored", add_special_tokens=False))
    batch.next_logits()
    texts = [" smiled.", " said nothing at all", " 看见了一艘船 🙂"]
    candidates = [member.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    scores = batch.score_many([ScoreRequest(0, len(prefix), candidates)])[0]
    for candidate, score in zip(candidates, scores, strict=True):
        logprobs = uncached_all_logits(member.model, prefix + candidate).float().log_softmax(-1)
        expected = torch.stack([logprobs[len(prefix) - 1 + j, t] for j, t in enumerate(candidate)])
        torch.testing.assert_close(score, expected, atol=5e-4, rtol=0)


@pytest.mark.packaged
@pytest.mark.parametrize("method", [SweetSpan(), SpecFuse(hedge_eta=1.0)], ids=["sweetspan", "specem"])
def test_three_families_greedy_sampled_stop_and_non_ascii(method) -> None:
    members = [packaged_member(n) for n in (QWEN, SMOL, GEMMA)]
    ensemble = Ensemble(members, method=method)
    greedy = ensemble.generate(CJK_PROMPT, max_new_tokens=24)
    data = greedy.data
    data[: len(data) - incomplete_utf8_suffix(data)].decode("utf-8")  # strict: nothing garbled
    assert any(ord(ch) > 0x2E80 for ch in greedy.text), greedy.text
    for member in members:
        assert member.table.spell(greedy.token_ids[member.name]) == data
    rounds = greedy.stats.method_stats["per_round"]
    assert rounds and all(r["winner"] for r in rounds)
    sampled = [ensemble.generate(CJK_PROMPT, max_new_tokens=16, temperature=0.7, seed=3) for _ in range(2)]
    assert sampled[0].text == sampled[1].text
    # A draft ends at a stop string, so a candidate holding one is scored shorter and the
    # winner can differ from the run without it: what must hold is the stop itself.
    stopped = ensemble.generate(CJK_PROMPT, max_new_tokens=24, stop=["\n", "朋友"])
    assert stopped.finish_reason == "stop"
    assert "\n" not in stopped.text and "朋友" not in stopped.text
    assert stopped.text.strip()


@pytest.mark.packaged
def test_a_random_weight_member_exits_after_the_warm_up(tiny_member) -> None:
    noise = tiny_member("tiny-llama")  # SmolLM2's real tokenizer, random weights
    members = [packaged_member(QWEN), packaged_member(SMOL), noise]
    result = Ensemble(members, method=SpecFuse(exit_warmup=2)).generate(PROMPTS[0], max_new_tokens=48)
    stats = result.stats.method_stats
    assert stats["exited"] == {0: ["tiny-llama"]} or "tiny-llama" in stats["exited"][0]
    rounds = stats["per_round"]
    assert all("tiny-llama" in r["drafters"] for r in rounds[:2])  # drafts during the warm-up
    assert all("tiny-llama" not in r["drafters"] for r in rounds[3:])  # then never again
    assert all("tiny-llama" not in r["winner"] for r in rounds)
