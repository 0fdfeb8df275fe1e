"""SAFE's text does not depend on where its rounds end.

Rounds end after `draft_len` pieces, after a piece the drafter is unsure of (`confident_drafts`),
and wherever the ensemble replaces a drafted piece. A verifier's state at a position must not
depend on whether that position began a round or lay inside a draft, or the same ensemble would
write different text for different draft lengths. Three different tokenizers with decisive random
weights disagree often (the hard case: verifiers that stop writing, re-read drafts and cover
text they did not write); with boundary correction, float32.
"""

from __future__ import annotations

import pytest

from ensemble_core import Ensemble
from ensemble_core.methods import SAFE
from reference import endless

PROMPTS = ["def add(a, b):\n    ", "x = [1, 2,", "你好，"]
SHAPES = {
    "five, confident": {"draft_len": 5},
    "one": {"draft_len": 1},
    "three, always": {"draft_len": 3, "confident_drafts": None},
}


@pytest.mark.parametrize("drafter", ["tiny-qwen2", "tiny-llama"])
def test_where_rounds_end_changes_no_text(drafter: str, tiny_member) -> None:
    members = [endless(tiny_member(name)) for name in ("tiny-qwen2", "tiny-llama", "tiny-gemma3")]
    disagreements = 0
    for prompt in PROMPTS:
        texts = {}
        for shape, params in SHAPES.items():
            result = Ensemble(members, method=SAFE(drafter=drafter, **params)).generate(prompt, max_new_tokens=16)
            texts[shape] = result.data
            disagreements += result.stats.method_stats.ensembled_positions
        assert len(set(texts.values())) == 1, (prompt, texts)
    assert disagreements > 10  # the members did disagree: the verifiers' rules were exercised
