"""How often a decode step reads device values to Python: on a GPU each read is a sync.

The count is deterministic (it depends on the code path, not on timing), so it is pinned here
per method: about one read per step for `Single`, a few for the token-level methods, a few more
for SAFE and the span and segment methods (see docs/guides/performance.md). The members are tiny
random-weight models on the real Qwen, SmolLM2 and Gemma tokenizers, made decisive and endless
(`reference.endless`): their odd text (byte pieces, rare tokens) takes the boundary-correction
paths a real model takes only now and then, so these are the counts' hard cases.
"""

from __future__ import annotations

import pytest
import torch

from ensemble_core import Ensemble
from ensemble_core.host_reads import HostReads
from ensemble_core.methods import SAFE, Contrastive, GaC, Single, SpecFuse, SweetSpan, UniTE
from reference import endless

# method -> (a factory given the first member's name, the most reads per committed token)
BUDGETS = {
    "single": (lambda first: Single(), 2),
    "gac": (lambda first: GaC(), 4),
    "unite": (lambda first: UniTE(), 4),
    "gate": (lambda first: GaC(threshold=0.5, primary=first), 4),
    "contrastive": (lambda first: Contrastive(), 4),
    "safe": (lambda first: SAFE(drafter=first), 6),
    "sweetspan": (lambda first: SweetSpan(), 6),
    "specfuse": (lambda first: SpecFuse(), 6),
}
PROMPT = "def is_prime(n):\n    "  # a raw prompt: the Gemma base model has no chat template


def reads_per_token(ensemble: Ensemble, tokens: int = 32) -> tuple[float, HostReads]:
    ensemble.generate(PROMPT, max_new_tokens=4)  # warm: one-time tables are not per-token work
    with HostReads() as reads:
        result = ensemble.generate(PROMPT, max_new_tokens=tokens)
    committed = result.stats.steps  # what counts toward max_new_tokens
    return reads.total / max(1, committed), reads


@pytest.mark.parametrize("method", list(BUDGETS))
@pytest.mark.parametrize("names", [("tiny-qwen2", "tiny-llama"), ("tiny-qwen2", "tiny-llama", "tiny-gemma3")])
def test_a_step_reads_the_device_a_few_times(method: str, names: tuple[str, ...], tiny_member) -> None:
    make, budget = BUDGETS[method]
    members = [endless(tiny_member(n)) for n in names]
    if method == "single":
        members = members[:1]
    elif method == "contrastive":
        members = members[:2]  # an expert and an amateur
    if method == "safe" and len(names) == 3:
        budget = 10  # each verifier's boundary corrections read once per round: on real text 4.5
    per_token, reads = reads_per_token(Ensemble(members, method=make(names[0])))
    assert per_token <= budget, f"{per_token:.1f} reads per token; the most frequent: {reads.by_site.most_common(5)}"


def test_every_kind_of_read_is_counted_where_it_happens() -> None:
    values = torch.arange(4.0)
    with HostReads() as reads:
        int(values[1]), float(values[2]), values.tolist(), bool(values.any()), values.nonzero()
        _ = [0, 1, 2, 3][values.argmax()]  # __index__
    assert reads.by_kind == {"__int__": 1, "__float__": 1, "tolist": 1, "__bool__": 1, "nonzero": 1, "__index__": 1}
    assert all("test_host_reads.py:" in site for site in reads.by_site)  # the lines above
