"""Token-level ensembles of three models with three different tokenizers.

Run: `python examples/token_ensembles.py` (after `make demo` has prepared the models).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import SAFE, GaC, UniTE

qwen = HFMember.from_pretrained("qwen2.5-coder-0.5b-instruct")
smol = HFMember.from_pretrained("smollm2-135m-instruct")
gemma = HFMember.from_pretrained("gemma-3-270m")  # three tokenizer families

prompt = "Once upon a time, in a small village,"
for method in (GaC(), GaC(threshold=0.5, primary="qwen"), UniTE(top_k=10), SAFE(drafter="qwen")):
    result = Ensemble([qwen, smol, gemma], method=method).generate(prompt, max_new_tokens=16)
    print(method, result.text, result.stats.method_stats.share_ensembled)
