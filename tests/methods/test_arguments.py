"""Every method's argument checks (at construction) and member references (when bound)."""

from __future__ import annotations

import pytest

from ensemble_core import Ensemble
from ensemble_core.errors import ConfigError, UnknownNameError
from ensemble_core.methods import SAFE, Contrastive, GaC, SpecFuse, SweetSpan, UniTE


@pytest.fixture
def pair(tiny_member):
    return [tiny_member("tiny-llama"), tiny_member("tiny-qwen2")]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: GaC(weights=[1, -1]), ConfigError, r"`weights` must all be >= 0"),
        (lambda: GaC(weights=[0, 0]), ConfigError, "must not all be zero"),
        (lambda: GaC(weights="1,0"), ConfigError, "must be numbers \\(one per member\\)"),
        (lambda: GaC(threshold=0.0), ConfigError, r"`threshold` has to be in \(0, 1\], but is 0.0"),
        (lambda: GaC(threshold=1.5), ConfigError, r"`threshold` has to be in \(0, 1\]"),
        (lambda: GaC(primary="tiny-llama"), ConfigError, "only applies with a `threshold`"),
        (lambda: UniTE(top_k=0), ConfigError, "`top_k` has to be a positive integer, but is 0"),
        (lambda: SAFE(draft_len=0), ConfigError, "`draft_len` has to be a positive integer"),
        (lambda: SAFE(base="vote"), ConfigError, r"`base` has to be one of \['gac', 'unite'\]"),
        (lambda: SAFE(sharpen="max"), ConfigError, "`sharpen` has to be one of"),
        (lambda: SAFE(sharpen_lambda=1.0), ConfigError, r"`sharpen_lambda` has to be in \(0, 1\)"),
        (lambda: SweetSpan(unit="lines"), ConfigError, r"`unit` has to be one of \['words', 'tokens'\]"),
        (lambda: SweetSpan(outlier_mad=0), ConfigError, "`outlier_mad` has to be > 0"),
        (lambda: SweetSpan(weights="auto"), ConfigError, "SweetSpan takes numbers, one per member."),
        (lambda: SweetSpan(weights=[1, -1, 0]), ConfigError, r"`weights` must all be >= 0"),
        (lambda: SpecFuse(weights="prompt"), ConfigError, "SpecFuse takes numbers, one per member \\(or learns"),
        (lambda: SpecFuse(score="perplexity"), ConfigError, r"`score` has to be one of \['logprob', 'logit'\]"),
        (lambda: SpecFuse(hedge_eta=-0.5), ConfigError, "`hedge_eta` has to be > 0"),
        (lambda: SpecFuse(exit_warmup=-1), ConfigError, "`exit_warmup` has to be a non-negative integer"),
        (lambda: SpecFuse(hedge_eta=1.0, weights=[1, 1]), ConfigError, "either `weights` or `hedge_eta`"),
        (lambda: Contrastive(beta=-0.5), ConfigError, r"`beta` has to be in \[0, inf\), but is -0.5"),
        (lambda: Contrastive(alpha=0), ConfigError, r"`alpha` has to be in \(0, 1\], but is 0"),
        (lambda: SweetSpan(self_score="false"), ConfigError, "`self_score` has to be true or false, but is 'false'"),
        (lambda: SAFE(skip_tests="no"), ConfigError, "`skip_tests` has to be true or false"),
        (lambda: SAFE(record=1), ConfigError, "`record` has to be true or false"),
        (lambda: SpecFuse(exit="false"), ConfigError, "`exit` has to be true or false"),
        (lambda: SpecFuse(exit_verify=None), ConfigError, "`exit_verify` has to be true or false"),
    ],
)
def test_bad_method_arguments_fail_at_construction(make, error, message) -> None:
    with pytest.raises(error, match=message):
        make()


def test_bad_references_to_members_fail_when_bound(pair, tiny_member) -> None:
    with pytest.raises(ConfigError, match="`weights` has 3 entries, but the ensemble has 2 members"):
        Ensemble(pair, method=GaC(weights=[1, 1, 1]))
    with pytest.raises(UnknownNameError, match="`primary` is 'gpt'"):
        Ensemble(pair, method=GaC(threshold=0.5, primary="gpt"))
    with pytest.raises(UnknownNameError, match="`drafter` is 'gpt'"):
        Ensemble(pair, method=SAFE(drafter="gpt"))
    with pytest.raises(UnknownNameError, match="matches several members"):
        Ensemble(pair, method=SAFE(drafter="tiny"))
    with pytest.raises(ConfigError, match="SAFE needs at least two members"):
        Ensemble(pair[:1], method="safe")
    assert Ensemble(pair, method=SAFE(drafter="tiny-q")).binding.reference == 1  # unique prefix
    with pytest.raises(UnknownNameError, match="`expert` is 'gpt'"):
        Ensemble(pair, method=Contrastive(expert="gpt"))
    with pytest.raises(ConfigError, match=r"`contrastive` takes two members, an expert and an amateur, but .* has 3"):
        Ensemble([*pair, tiny_member("tiny-gemma3")], method="contrastive")


@pytest.mark.parametrize("method", ["gac", "unite", "safe"])
def test_methods_by_name_with_parameters(pair, method) -> None:
    params = {"weights": [2, 1]}
    ensemble = Ensemble(pair, method=method, method_params=params)
    result = ensemble.generate("The", max_new_tokens=6)
    assert result.stats.method == method
    assert result.usage.completion_tokens >= 1
    assert set(result.token_ids) == {"tiny-llama", "tiny-qwen2"}
    for member in pair:  # every member's ids spell the committed text exactly
        assert member.table.spell(result.token_ids[member.name]).startswith(result.data)
