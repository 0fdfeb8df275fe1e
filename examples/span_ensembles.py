"""Span- and segment-level ensembles of three models with three different tokenizers.

Run: `python examples/span_ensembles.py` (after `make demo` has prepared the models).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import SpecFuse, SweetSpan

members = [
    HFMember.from_pretrained(n) for n in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
]
for method in (SweetSpan(span_words=4), SpecFuse(segment_tokens=10), SpecFuse(hedge_eta=1.0)):
    result = Ensemble(members, method=method).generate("Once upon a time,", max_new_tokens=20)
    print(method, result.text, [r.winner for r in result.stats.method_stats.per_round])
