"""The core API on one packaged model: `generate`, `stream` and `generate_batch`.

A list of messages goes through the model's chat template; a `str` prompt is raw completion.
The result holds the text, why it ended, token counts and timings.

Run: `python examples/quickstart.py` (after `make demo` has prepared the models).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import Single

# A packaged name, a Hugging Face Hub id or a local folder all work the same way.
qwen = HFMember.from_pretrained("qwen2.5-coder-0.5b-instruct", dtype="bfloat16", device="cpu")
ens = Ensemble([qwen], method=Single())

messages = [{"role": "user", "content": "Give me a one-line Python expression that sums 1..10."}]
result = ens.generate(messages, max_new_tokens=48, stop=["\n\n"], temperature=0.0, seed=0)
print(result.text)
print(result.finish_reason, result.usage.prompt_tokens, result.usage.completion_tokens)
print(f"{result.stats.tokens_per_second:.1f} tokens/s")

for chunk in ens.stream("def fibonacci(n):", max_new_tokens=32):  # a str prompt: raw completion
    print(chunk.text, end="", flush=True)
print()

for r in ens.generate_batch(["The capital of France is", "2 + 2 ="], max_new_tokens=8):
    print(repr(r.text), r.finish_reason)
