"""Member weights without tuning: `GaC(weights="auto")` weighs the members anew for each prompt.

With equal weights a weak member pulls every token as hard as a strong one. With "auto", every
member first scores the prompt's own text (log-likelihood per byte, so members with different
tokenizers compare) and the one that predicts it best leads: here Qwen2.5-Coder leads on code,
and less so on a story. The weights each prompt got are in `result.stats.method_stats.weights`.
UniTE and SAFE take the same `weights="auto"`. In the core a method's default is equal weights;
ChatEnsemble, EnsembleLLM, `ensemble-llm run` and `serve` default to "auto" (spelled out, it is
`method_params={"weights": "auto"}`; in an evaluation config, `weights: auto`).

Run: `python examples/auto_weights.py` (after `make demo` has prepared the models).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import GaC

members = [
    HFMember.from_pretrained(n) for n in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
]
for prompt in ("def is_prime(n):\n", "Once upon a time, in a small village,"):
    print(f"=== {prompt!r}")
    for label, method in (("equal weights", GaC(weights="equal")), ('weights="auto"', GaC(weights="auto"))):
        result = Ensemble(members, method=method).generate(prompt, max_new_tokens=12)
        weights = ", ".join(f"{name} {w:.2f}" for name, w in result.stats.method_stats.weights.items())
        print(f"{label}: {weights}\n  {result.text!r}")
