"""Each method's rules on hand-made distributions (`FakeMember`: real tokenizers, no model).

Ties, a member that always wins, one that never agrees, an end of text mid-draft, weights,
the gate, the union across tokenizer families, SweetSpan's two-member rule, and the template's
dummy-prefix space at the start of a reply. Milliseconds each.
"""

from __future__ import annotations

import statistics

import pytest

from ensemble_core import Ensemble
from ensemble_core.methods import SAFE, Contrastive, GaC, Single, SpecFuse, SweetSpan, UniTE
from ensemble_core.methods.drafting import SpanCandidate
from ensemble_core.methods.span import filtered_scores, rank_combined, select_span, weighted_median
from ensemble_core.testing import FakeMember

SMOL, QWEN = "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"


def scripted(load_tokenizer, family: str, name: str, script) -> FakeMember:
    return FakeMember.scripted(load_tokenizer(family), name, script)


def after(text: str, table: dict[str, dict[str, float]]) -> dict[str, float]:
    """The entry of `table` whose key the text ends with (the longest such key), else the end."""
    best = max((k for k in table if text.endswith(k)), key=len, default=None)
    return table[best] if best is not None else {"<eos>": 1.0}


PROMPT = "Tell me:"


@pytest.fixture
def loud(load_tokenizer) -> FakeMember:
    """Always sure: ' yes' then ' yes' again, then the end."""
    return scripted(
        load_tokenizer, SMOL, "loud", lambda t: after(t, {":": {" yes": 0.9, " no": 0.1}, " yes": {"<eos>": 1.0}})
    )


@pytest.fixture
def contrary(load_tokenizer) -> FakeMember:
    """Never agrees with `loud` (another tokenizer family): prefers ' no'."""
    return scripted(
        load_tokenizer, QWEN, "contrary", lambda t: after(t, {":": {" no": 0.6, " yes": 0.4}, " no": {"<eos>": 1.0}})
    )


@pytest.mark.parametrize("boundary", ["correct", "retokenize"])
def test_gac_averages_across_tokenizer_families(loud, contrary, boundary) -> None:
    result = Ensemble([loud, contrary], method=GaC(), boundary=boundary).generate(PROMPT, max_new_tokens=4)
    assert result.text == " yes"  # (0.9 + 0.4) / 2 > (0.1 + 0.6) / 2
    assert result.finish_reason == "eos"
    weighted = Ensemble([loud, contrary], method=GaC(weights=[1, 5]), boundary=boundary).generate(
        PROMPT, max_new_tokens=4
    )
    assert weighted.text == " no"  # (0.1 + 5 * 0.6) / 6 > (0.9 + 5 * 0.4) / 6
    stats = result.stats.method_stats
    assert stats.steps == 2 and stats.share_ensembled == 1.0


def test_one_sided_weights_follow_that_member_exactly(loud, contrary) -> None:
    for weights, name in (([1, 0], "loud"), ([0, 1], "contrary")):
        alone = Ensemble([loud, contrary], method=Single(member=name)).generate(PROMPT, max_new_tokens=4)
        result = Ensemble([loud, contrary], method=GaC(weights=weights)).generate(PROMPT, max_new_tokens=4)
        assert result.text == alone.text and result.token_ids[name] == alone.token_ids[name]


def test_exact_ties_go_to_the_heaviest_members_choice(load_tokenizer) -> None:
    first = scripted(load_tokenizer, SMOL, "first", lambda t: after(t, {":": {" a": 0.5, " b": 0.5}}))
    second = scripted(load_tokenizer, QWEN, "second", lambda t: after(t, {":": {" b": 0.5, " a": 0.5}}))
    # Equal weights: the first member counts as heaviest (first among equals); its own choice
    # on its own tie is its lowest id, ' a' or ' b' whichever the tokenizer numbers first.
    own = Ensemble([first], method=Single()).generate(PROMPT, max_new_tokens=1).text
    assert Ensemble([first, second], method=GaC()).generate(PROMPT, max_new_tokens=1).text == own
    other = Ensemble([second], method=Single()).generate(PROMPT, max_new_tokens=1).text
    assert Ensemble([first, second], method=GaC(weights=[1, 2])).generate(PROMPT, max_new_tokens=1).text == other


def contrast_pair(load_tokenizer, expert_table, amateur_table) -> list[FakeMember]:
    """An expert and an amateur of one tokenizer family (contrastive decoding's setting); both
    write the prompt's ':' themselves, so scoring options from inside the prompt's last token
    (prompt-boundary correction) sees the prompt as likely."""
    return [
        scripted(load_tokenizer, QWEN, "expert", lambda t: after(t, {"me": {":": 1.0}, ":": expert_table})),
        scripted(load_tokenizer, QWEN, "amateur", lambda t: after(t, {"me": {":": 1.0}, ":": amateur_table})),
    ]


def test_contrastive_prefers_what_the_expert_likes_more_than_the_amateur(load_tokenizer) -> None:
    members = contrast_pair(
        load_tokenizer, {" yes": 0.5, " no": 0.45, " maybe": 0.05}, {" yes": 0.9, " no": 0.05, " maybe": 0.05}
    )
    # ' yes': log .5 + .5 (log .5 - log .9) = -0.99; ' no': log .45 + .5 (log .45 - log .05) = 0.30;
    # ' maybe' (exactly at the plausibility cut .1 * .5): log .05 + 0 = -3.0
    assert Ensemble(members, method=Contrastive()).generate(PROMPT, max_new_tokens=1).text == " no"
    assert Ensemble(members, method=GaC()).generate(PROMPT, max_new_tokens=1).text == " yes"
    # beta = 0 is the expert alone; the amateur as expert follows its own choice
    assert Ensemble(members, method=Contrastive(beta=0)).generate(PROMPT, max_new_tokens=1).text == " yes"
    assert Ensemble(members, method=Contrastive(expert="amateur")).generate(PROMPT, max_new_tokens=1).text == " yes"


def test_contrastive_never_chooses_what_the_expert_finds_implausible(load_tokenizer) -> None:
    members = contrast_pair(
        load_tokenizer, {" yes": 0.9, " no": 0.08, " maybe": 0.02}, {" yes": 0.99999, " no": 0.00001}
    )
    # ' no' scores log .08 + .5 log(.08 / 1e-5) = 1.97 against ' yes' -0.11, but has only .08 of
    # the expert's mass, below .1 of its best (.9): out of reach unless alpha is lowered
    assert Ensemble(members, method=Contrastive()).generate(PROMPT, max_new_tokens=1).text == " yes"
    assert Ensemble(members, method=Contrastive(alpha=0.05)).generate(PROMPT, max_new_tokens=1).text == " no"


def test_contrastive_scores_options_by_the_same_rule(load_tokenizer) -> None:
    members = contrast_pair(load_tokenizer, {" yes": 0.5, " no": 0.45}, {" yes": 0.9, " no": 0.05})
    [averaged] = Ensemble(members, method=GaC()).option_probabilities([PROMPT], [[" yes", " no"]])
    [contrasted] = Ensemble(members, method=Contrastive()).option_probabilities([PROMPT], [[" yes", " no"]])
    assert averaged[0] > averaged[1] and contrasted[1] > contrasted[0]
    assert sum(contrasted) == pytest.approx(1.0)
    # an option below the plausibility cut gets nothing, however much the amateur dislikes it
    members = contrast_pair(load_tokenizer, {" yes": 0.9, " no": 0.05}, {" yes": 0.99999, " no": 0.00001})
    [cut] = Ensemble(members, method=Contrastive()).option_probabilities([PROMPT], [[" yes", " no"]])
    assert cut == [1.0, 0.0]


def test_contrastive_samples_only_plausible_text_and_repeats_with_a_seed(load_tokenizer) -> None:
    members = contrast_pair(load_tokenizer, {" yes": 0.9, " no": 0.08, " maybe": 0.02}, {" yes": 0.99, " no": 0.01})
    strict, loose = Ensemble(members, method=Contrastive()), Ensemble(members, method=Contrastive(alpha=0.01))
    drawn = {strict.generate(PROMPT, max_new_tokens=1, temperature=1.0, seed=seed).text for seed in range(20)}
    assert drawn == {" yes"}  # ' no' and ' maybe' are below .1 of the expert's best
    drawn = [loose.generate(PROMPT, max_new_tokens=1, temperature=1.0, seed=seed).text for seed in range(20)]
    assert {" no", " maybe"} & set(drawn)  # ' no' scores log .08 + .5 log 8 = -1.49 against ' yes' -0.10
    again = [loose.generate(PROMPT, max_new_tokens=1, temperature=1.0, seed=seed).text for seed in range(20)]
    assert again == drawn


def test_unite_scores_a_candidate_a_member_lacks_through_its_first_sub_token(load_tokenizer) -> None:
    # ' Kubernetes' is one token for neither; Qwen spells it ' Kub' + 'ernetes': its mass on
    # ' Kub' counts for the SmolLM2-side candidate text when UniTE asks Qwen about it.
    smol = scripted(load_tokenizer, SMOL, "smol", lambda t: after(t, {":": {" cat": 0.55, " dog": 0.45}}))
    qwen = scripted(load_tokenizer, QWEN, "qwen", lambda t: after(t, {":": {" dog": 0.7, " cat": 0.3}}))
    result = Ensemble([smol, qwen], method=UniTE(top_k=2)).generate(PROMPT, max_new_tokens=1)
    assert result.text == " dog"  # (0.45 + 0.7) / 2 > (0.55 + 0.3) / 2


def test_the_gate_takes_a_confident_primary_without_running_the_others(loud, contrary) -> None:
    result = Ensemble([loud, contrary], method=GaC(threshold=0.5, primary="loud")).generate(PROMPT, max_new_tokens=4)
    assert result.text == " yes"
    assert "contrary" not in result.stats.members or result.stats.members["contrary"].forwards == 0
    assert result.stats.method_stats.ensembled_steps == 0


def test_safe_skips_where_the_verifier_agrees_and_decides_where_it_does_not(load_tokenizer, loud, contrary) -> None:
    echo = scripted(
        load_tokenizer, QWEN, "echo", lambda t: after(t, {":": {" yes": 0.8, " no": 0.2}, " yes": {"<eos>": 1.0}})
    )
    agreed = Ensemble([loud, echo], method=SAFE(drafter="loud")).generate(PROMPT, max_new_tokens=4)
    stats = agreed.stats.method_stats
    assert agreed.text == " yes" and stats.ensembled_positions == 0 and stats.skipped_agree >= 1
    disputed = Ensemble([loud, contrary], method=SAFE(drafter="loud", record=True)).generate(PROMPT, max_new_tokens=4)
    # 0.9 * 0.5 + 0.4 * 0.5 = 0.65 > 1/2 on ' yes': skipped by mass, not ensembled.
    assert disputed.text == " yes"
    assert disputed.stats.method_stats.skipped_mass == 1
    strict = Ensemble([loud, contrary], method=SAFE(drafter="loud", skip_tests=False)).generate(
        PROMPT, max_new_tokens=4
    )
    assert strict.text == " yes" and strict.stats.method_stats.ensembled_positions >= 1


def test_safe_ends_at_a_drafted_end_of_text(load_tokenizer) -> None:
    # The drafter drafts ' yes', ' yes', <eos> in one round; the verifier agrees throughout.
    table = {":": {" yes": 1.0}, ": yes": {" yes": 1.0}, "yes yes": {"<eos>": 1.0}}
    drafter = scripted(load_tokenizer, SMOL, "drafter", lambda t: after(t, table))
    verifier = scripted(load_tokenizer, QWEN, "verifier", lambda t: after(t, table))
    result = Ensemble([drafter, verifier], method=SAFE(draft_len=5)).generate(PROMPT, max_new_tokens=10)
    assert result.text == " yes yes" and result.finish_reason == "eos"
    assert result.stats.method_stats.rounds == 1


def test_sweetspan_with_two_members_follows_what_both_prefer() -> None:
    """With its own score dropped each of two scorers sees one span, and raw log-probabilities of
    two models break the tie: the weaker model's span won although both members preferred the
    other. Both prefer span 0 here (each scores it higher than span 1)."""
    candidates = [SpanCandidate(b" sure", False, {0: 1}), SpanCandidate(b" maybe", False, {1: 1})]
    scores = {0: [-1.0, -2.0], 1: [-3.0, -3.5]}  # member 1 is a weaker (lower log-prob) model
    assert select_span(candidates, scores, self_score=False, outlier_mad=2.0) == 0
    # Each prefers its own span: the tie goes to the larger margin within one model (0.5 vs 1.0).
    scores = {0: [-1.0, -2.0], 1: [-3.5, -3.0]}
    assert select_span(candidates, scores, self_score=False, outlier_mad=2.0) == 0
    scores = {0: [-1.0, -1.2], 1: [-4.0, -2.0]}
    assert select_span(candidates, scores, self_score=False, outlier_mad=2.0) == 1


def test_three_scorers_still_drop_self_scores_and_outliers() -> None:
    candidates = [
        SpanCandidate(b"a", False, {0: 1}),
        SpanCandidate(b"b", False, {1: 1}),
        SpanCandidate(b"c", False, {2: 1}),
    ]
    scores = {0: [-0.1, -1.0, -2.0], 1: [-1.5, -0.2, -1.0], 2: [-1.2, -0.9, -0.3], 3: [-1.4, -9.0, -1.1]}
    kept = filtered_scores(candidates, scores, self_score=False, outlier_mad=2.0)
    assert 0 not in kept[0] and 1 not in kept[1] and 2 not in kept[2]  # no self-preference
    assert 1 not in kept[3]  # -9.0 is far outside the other scores of candidate "b"
    assert 2 not in kept[0]  # so is -2.0 for "c"
    # "b" and "c" both rank first with every scorer that kept them; "c" wins on margins within
    # each scorer (0.25 and 0.15 above those scorers' means, against 0 and 0.15 for "b").
    assert rank_combined(kept, 3)[1] == rank_combined(kept, 3)[2] == 1.0
    assert select_span(candidates, scores, self_score=False, outlier_mad=2.0) == 2


def test_sweetspan_weights_let_a_strong_member_judge_its_own_span_only_with_self_scores() -> None:
    """A strong member (0) among two weak ones that each prefer their own span and then each
    other's: dropping self-scores hands span "a" to the weak members alone, and no weights can
    bring it back; with self-scores kept and the strong member weighted up, "a" wins."""
    candidates = [
        SpanCandidate(b"a", False, {0: 1}),
        SpanCandidate(b"b", False, {1: 1}),
        SpanCandidate(b"c", False, {2: 1}),
    ]
    scores = {0: [-0.1, -2.0, -1.0], 1: [-1.0, -0.2, -0.5], 2: [-1.0, -0.5, -0.2]}
    strong = (0.9, 0.05, 0.05)
    rules = {"self_score": False, "outlier_mad": 100.0}  # no outliers: the ranks alone decide
    assert select_span(candidates, scores, **rules) == 2
    assert select_span(candidates, scores, **rules, weights=strong) == 2
    rules["self_score"] = True
    assert select_span(candidates, scores, **rules) == 2  # a 1/3, b 1/2, c 2/3
    assert select_span(candidates, scores, **rules, weights=strong) == 0  # a 0.9, b 0.075, c 0.525
    kept = filtered_scores(candidates, scores, self_score=True, outlier_mad=100.0)
    assert rank_combined(kept, 3, strong) == pytest.approx([0.9, 0.075, 0.525])
    # weights that are all equal give exactly the plain mean (ties stay ties)
    assert rank_combined(kept, 3, (1 / 3, 1 / 3, 1 / 3)) == rank_combined(kept, 3)


def test_a_confident_strong_scorer_is_not_an_outlier_for_being_confident() -> None:
    """Scores traced on an arithmetic problem (Qwen + SmolLM2 + Gemma-3): Qwen is sure of its own
    span, the weak members find all three about equally likely. On the raw scale every score Qwen
    gave lay far from the weak members' median and was dropped, so even weights (1, 0, 0) wrote
    the weak members' choice. Standardised per scorer, Qwen's judgement stays; weighted up, it
    defines the consensus and wins."""
    candidates = [
        SpanCandidate(b" = 5. So the", False, {0: 1}),
        SpanCandidate(b" = 10.", False, {1: 1}),
        SpanCandidate(b" = 15 -", False, {2: 1}),
    ]
    scores = {0: [-0.002, -1.35, -2.05], 1: [-0.45, -0.24, -0.31], 2: [-0.51, -0.27, -0.33]}
    for weights in ((1.0, 0.0, 0.0), (0.9, 0.05, 0.05)):
        kept = filtered_scores(candidates, scores, self_score=True, outlier_mad=2.0, weights=weights)
        assert kept[0] == dict(enumerate(scores[0]))
        assert select_span(candidates, scores, self_score=True, outlier_mad=2.0, weights=weights) == 0
    # At equal weights the two weak members, who agree, outvote it: a dissent of one in three.
    kept = filtered_scores(candidates, scores, self_score=True, outlier_mad=2.0)
    assert 0 not in kept[0] and select_span(candidates, scores, self_score=True, outlier_mad=2.0) == 1


def test_outlier_consensus_is_theweighted_median() -> None:
    values = [0.3, -1.2, 2.5, 0.0, -0.7, 1.1]
    for count in range(1, len(values) + 1):
        pairs = [(0.25, v) for v in values[:count]]  # equal weights: the plain median
        assert weighted_median(pairs) == pytest.approx(statistics.median(values[:count]))
        assert weighted_median([(0.0, v) for v in values[:count]]) == pytest.approx(statistics.median(values[:count]))
    assert weighted_median([(0.6, 2.5), (0.2, -1.0), (0.2, 0.0)]) == 2.5  # past one half: its value
    assert weighted_median([(0.5, 2.5), (0.25, -1.0), (0.25, 0.0)]) == 1.25  # exactly half: between


def test_an_impossible_span_stays_out_of_the_outlier_test_and_ranks_last() -> None:
    candidates = [SpanCandidate(bytes([97 + c]), False, {c: 1}) for c in range(3)]
    scores = {0: [-0.5, float("-inf"), -1.0], 1: [-0.4, float("-inf"), -0.9], 2: [-0.6, -0.2, -1.1]}
    kept = filtered_scores(candidates, scores, self_score=True, outlier_mad=2.0)
    assert kept[0][1] == float("-inf") and kept[1][1] == float("-inf")
    assert select_span(candidates, scores, self_score=True, outlier_mad=2.0) == 0


@pytest.mark.parametrize("method", [SweetSpan(span_words=2), SpecFuse(segment_tokens=4)], ids=["sweetspan", "specfuse"])
def test_span_methods_follow_a_member_that_always_wins(load_tokenizer, method) -> None:
    story = {":": {" the": 1.0}, "the": {" cat": 1.0}, "cat": {" sat": 1.0}, "sat": {"<eos>": 1.0}}
    noise = {":": {" a": 0.5, " an": 0.5}, "a": {" a": 1.0}, "an": {" a": 1.0}}
    sure = scripted(load_tokenizer, SMOL, "sure", lambda t: after(t, story))
    unsure = scripted(load_tokenizer, QWEN, "unsure", lambda t: after(t, noise))
    result = Ensemble([sure, unsure], method=method).generate(PROMPT, max_new_tokens=12)
    assert result.text == " the cat sat"
    assert result.stats.method_stats.winners().get("sure", 0) >= 1


def test_a_template_separator_is_not_split_from_the_reply(load_tokenizer) -> None:
    """A SentencePiece member whose template writes a space after `[/INST]` votes `▁Hello`; a
    byte-level member votes `Hello`. The space is the template's, so both vote for "Hello"."""
    mistral = load_tokenizer("mistral-7b")
    mistral.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
        "{% else %} {{ m['content'] }}</s>{% endif %}{% endfor %}"
    )
    sentencepiece = FakeMember.scripted(
        mistral, "spm", lambda t: after(t, {"[/INST]": {" Hello": 0.6, " Hi": 0.4}, "Hello": {"<eos>": 1.0}})
    )
    byte_level = scripted(
        load_tokenizer,
        SMOL,
        "bpe",
        lambda t: after(t, {"assistant\n": {"Hi": 0.55, "Hello": 0.45}, "Hello": {"<eos>": 1.0}}),
    )
    messages = [{"role": "user", "content": "Greet me."}]
    alone = Ensemble([sentencepiece], method=Single()).generate(messages, max_new_tokens=3)
    assert alone.text == "Hello"  # not " Hello": the space was the template's
    together = Ensemble([sentencepiece, byte_level], method=GaC()).generate(messages, max_new_tokens=3)
    assert together.text == "Hello"  # 0.6 + 0.45 beats 0.4 + 0.55: the votes were not split


@pytest.mark.parametrize("boundary", ["correct", "retokenize"])
def test_safe_keeps_every_verifier_distribution_of_a_long_reading(load_tokenizer, boundary) -> None:
    """SmolLM2 reads five CJK characters in fifteen byte tokens: the verifier has a distribution
    at every drafted position (it once kept only the last eight, and the rest counted as
    positions no verifier could judge)."""
    chars = "你好世界啊"
    table = {":": {chars[0]: 1.0}, **{chars[k]: {chars[k + 1]: 1.0} for k in range(len(chars) - 1)}}
    drafter = scripted(load_tokenizer, QWEN, "drafter", lambda t: after(t, table))
    reader = scripted(load_tokenizer, SMOL, "reader", lambda t: {"<eos>": 0.5, " the": 0.5})
    method = SAFE(drafter="drafter", draft_len=5, skip_tests=False, record=True)
    result = Ensemble([drafter, reader], method=method, boundary=boundary).generate(PROMPT, max_new_tokens=5)
    stats = result.stats.method_stats
    first_round = [d for d in stats.decisions if d.round == 1]
    assert len(first_round) == 5 and stats.oov_like == 0
    assert all(d.decision == "ensembled" for d in first_round)
    assert result.text == chars  # the drafter is sure; the reader is not
