"""Member weights that need no tuning (`weights="prompt"`, `"agreement"`, `"auto"`), on scripted
members (`FakeMember`: a real tokenizer, hand-made distributions, no model)."""

from __future__ import annotations

import math

import pytest

from ensemble_core import Ensemble
from ensemble_core.errors import ConfigError
from ensemble_core.methods import SAFE, GaC, SpecFuse, UniTE
from ensemble_core.methods.weighting import AUTO_RULE, Agreement, WeightRule, prompt_weights, rule_of
from ensemble_core.testing import FakeMember

SMOL = "smollm2-135m-instruct"
CODE, PROSE = "def add(a, b): return a + b. Answer:", "The cat sat on the warm mat. Answer:"


def prompt_pieces(tokenizer, prompt: str) -> dict[str, str]:
    """Each prefix of the prompt's own tokenisation -> the text of its next token."""
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    return {tokenizer.decode(ids[:k]): tokenizer.decode(ids[k : k + 1]) for k in range(1, len(ids))}


def reader(tokenizer, name: str, knows: str, prefers: dict[str, float]) -> FakeMember:
    """Reads the prompt `knows` fluently (0.9 on each true next token) and any other prompt
    badly (0.05); at the end of either prompt it answers with `prefers`, then ends."""
    pieces = {prompt: prompt_pieces(tokenizer, prompt) for prompt in (CODE, PROSE)}

    def script(text: str) -> dict[str, float]:
        if text in (CODE, PROSE):
            return prefers
        for prompt, by_prefix in pieces.items():
            if text in by_prefix:
                sure = 0.9 if prompt == knows else 0.05
                return {by_prefix[text]: sure, "<eos>": 1 - sure}
        return {"<eos>": 1.0}

    return FakeMember.scripted(tokenizer, name, script)


@pytest.fixture
def coder_and_writer(load_tokenizer) -> list[FakeMember]:
    tokenizer = load_tokenizer(SMOL)
    return [
        reader(tokenizer, "coder", CODE, {" no": 0.6, " yes": 0.4}),
        reader(tokenizer, "writer", PROSE, {" yes": 0.9, " no": 0.1}),
    ]


def test_prompt_weights_are_a_softmax_of_log_likelihood_per_byte() -> None:
    better, worse = prompt_weights([-1.0, -1.1])
    assert better / worse == pytest.approx(math.e)  # 0.1 nats/byte better: e times the weight
    assert prompt_weights([None, None, None]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))  # nothing to go on
    assert prompt_weights([-1.0, None, -1.0]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))  # unknown gets the mean


def test_a_member_scores_a_text_per_byte_of_the_tokens_it_predicted(coder_and_writer, load_tokenizer) -> None:
    coder, _ = coder_and_writer
    ids = load_tokenizer(SMOL).encode(CODE, add_special_tokens=False)
    [score] = coder.text_logprob([CODE])
    assert score.logprob == pytest.approx((len(ids) - 1) * math.log(0.9), rel=1e-5)
    assert score.scored_bytes == len(coder.table.spell(ids[1:]))  # the first token has no context
    [tail] = coder.text_logprob([CODE], max_bytes=10)
    assert tail.scored_bytes < 10  # only the last bytes are scored


def test_the_prompt_rule_weights_each_prompt_by_who_reads_it_best(coder_and_writer) -> None:
    equal = Ensemble(coder_and_writer, method=GaC())
    assert [r.text for r in equal.generate_batch([CODE, PROSE], max_new_tokens=3)] == [" yes", " yes"]
    ensemble = Ensemble(coder_and_writer, method=GaC(weights="prompt"))
    code, prose = ensemble.generate_batch([CODE, PROSE], max_new_tokens=3)
    assert code.text == " no"  # the coder reads the code prompt far better: its " no" wins there
    assert prose.text == " yes"
    assert code.stats.method_stats.weights["coder"] > 0.95
    assert prose.stats.method_stats.weights["writer"] > 0.95
    assert ensemble.generate(CODE, max_new_tokens=3).text == " no"  # batched or alone, the same


def test_the_agreement_rule_learns_from_the_committed_text(load_tokenizer) -> None:
    tokenizer = load_tokenizer(SMOL)
    start = "Tell me:"

    def steady(text: str) -> dict[str, float]:
        return {start: {" yes": 1.0}, start + " yes": {" no": 0.55, " yes": 0.45}}.get(text, {"<eos>": 1.0})

    def wavering(text: str) -> dict[str, float]:
        return {start: {" yes": 0.6, " no": 0.4}, start + " yes": {" yes": 0.6, " no": 0.4}}.get(text, {"<eos>": 1.0})

    members = [FakeMember.scripted(tokenizer, "steady", steady), FakeMember.scripted(tokenizer, "wavering", wavering)]
    # Equal weights at the second step: (0.45 + 0.6) / 2 for " yes" beats (0.55 + 0.4) / 2.
    assert Ensemble(members, method=GaC()).generate(start, max_new_tokens=3).text == " yes yes"
    # After the first step the steady member gave the committed " yes" 1.0 and the other 0.6:
    # Hedge moves the weights to about (0.72, 0.28), and its " no" wins the second step.
    learned = Ensemble(members, method=GaC(weights="agreement")).generate(start, max_new_tokens=3)
    assert learned.text == " yes no"
    # The stats give the last step's weights (at the end, after the " no" was rewarded too):
    # log-weight gap 2.355 * (1 - 0.6) + 1.665 * (0.55 - 0.4) = 1.192, a share of 0.767.
    assert learned.stats.method_stats.weights["steady"] == pytest.approx(0.767, abs=0.002)


def test_hedge_never_revives_a_member_weighted_zero() -> None:
    hedge = Agreement([0.0, 1.0, 1.0])
    hedge.observe({0: 1.0, 1: 1.0, 2: 0.0})
    assert hedge.weights[0] == 0.0 and hedge.weights[1] > hedge.weights[2] > 0


@pytest.mark.parametrize("method", [GaC, UniTE, lambda **kw: SAFE(drafter="coder", **kw)])
def test_every_token_method_accepts_the_rule_names(method, coder_and_writer) -> None:
    for name in ("auto", "prompt", "agreement"):
        result = Ensemble(coder_and_writer, method=method(weights=name)).generate(CODE, max_new_tokens=3)
        assert result.text in (" yes", " no")
    assert rule_of("auto") is AUTO_RULE and isinstance(AUTO_RULE, WeightRule)


def test_unknown_rule_names_and_segment_methods_are_refused_before_any_work(coder_and_writer) -> None:
    with pytest.raises(ConfigError, match="auto"):
        GaC(weights="perplexity")
    with pytest.raises((ConfigError, TypeError)):
        SpecFuse(weights="auto")
