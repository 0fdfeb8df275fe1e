"""A member in a Ray actor (`RayMember`): its model runs in another process, node or GPU.

SmolLM2 135M loads in a Ray actor (Ray starts a local cluster on first use, or joins the one
at `$RAY_ADDRESS`), Qwen2.5-Coder 0.5B in this process, and the two write one answer under
GaC. The driver keeps only SmolLM2's tokenizer; each step's distribution crosses from the
actor as a small summary. The text is the same as with both members in this process.

Needs Ray: `pip install "ensemble-llm[ray]"` (`make demo` installs it).
Run: `python examples/ray_members.py` (after `make demo` has prepared the models).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_core import Ensemble, HFMember, RayMember

messages = [{"role": "user", "content": "Explain Python generators in one sentence."}]
qwen = HFMember.from_pretrained("qwen2.5-coder-0.5b-instruct")  # in this process
smol = RayMember.from_pretrained("smollm2-135m-instruct", num_cpus=1)  # in a Ray actor (num_gpus=1: on its GPU)
with Ensemble([qwen, smol], method="gac") as ensemble:  # closing the ensemble ends the actor too
    remote = ensemble.generate(messages, max_new_tokens=24)
print(f"with SmolLM2 in a Ray actor: {remote.text!r}")
print(f"forward seconds per member: {remote.summary()['member_seconds']}")

members = [HFMember.from_pretrained(name) for name in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")]
with Ensemble(members, method="gac") as ensemble:  # both in this process
    local = ensemble.generate(messages, max_new_tokens=24)
print(f"the same text as with both in this process: {local.text == remote.text}")
