"""Generate with each packaged model through the ensemble-llm core (method: Single).

Run with `make demo` (it sets everything up first), or `python examples/demo.py`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers.utils import logging as hf_logging

from ensemble_core import Ensemble, HFMember
from ensemble_core.methods import Single
from ensemble_core.packaged import model_path

CHAT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
RAW = "Once upon a time, in a small village,"


def main() -> None:
    hf_logging.disable_progress_bar()
    for name in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"):
        member = HFMember.from_pretrained(name)
        ensemble = Ensemble([member], method=Single())
        prompt = CHAT if member.tokenizer.chat_template else RAW  # Gemma-3 270M is a base model
        print(f"=== {name}  ({model_path(name)})")
        print(f"prompt: {prompt if isinstance(prompt, str) else prompt[-1]['content']}")
        result = None
        for chunk in ensemble.stream(prompt, max_new_tokens=48):
            print(chunk.text, end="", flush=True)
            result = chunk.result or result
        if result is None:  # a stream always ends with a result; this only guards the printout
            continue
        print(
            f"\n--- {result.stats.steps} tokens in {result.stats.wall_seconds:.2f} s = "
            f"{result.stats.tokens_per_second:.1f} tokens/s; finish: {result.finish_reason}; "
            f"prompt tokens: {result.usage.prompt_tokens}\n"
        )


if __name__ == "__main__":
    main()
