"""A LangChain chain (prompt | ChatEnsemble | parser) on a two-model ensemble, streamed.

Qwen2.5-Coder 0.5B and SmolLM2 135M (two tokenizers, two chat templates) write each reply
together under SAFE: Qwen drafts, both verify. Swap `ChatEnsemble` for any other chat model
and nothing else in the chain changes.

Run: `python examples/langchain_chain.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from transformers.utils import logging as hf_logging

from langchain_ensemble import ChatEnsemble

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


def main() -> None:
    hf_logging.disable_progress_bar()
    llm = ChatEnsemble(models=MODELS, method="safe", method_params={"drafter": "qwen"}, max_tokens=48)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a concise Python tutor."), ("human", "Explain {topic} in two sentences.")]
    )
    chain = prompt | llm | StrOutputParser()

    print("=== streamed answer")
    for piece in chain.stream({"topic": "list comprehensions"}):
        print(piece, end="", flush=True)
    print()

    message = (prompt | llm).invoke({"topic": "generators"})
    info = message.response_metadata["ensemble"]
    print("=== invoke, with the ensemble's report")
    print(message.content)
    print(f"model: {message.response_metadata['model_name']}")
    print(f"usage: {message.usage_metadata} (in {message.response_metadata['usage_counted_by']}'s tokens)")
    print(f"share of tokens decided by the whole ensemble: {info['share_ensembled']:.0%}")
    print(f"forward seconds per member: {info['member_seconds']}")


if __name__ == "__main__":
    main()
