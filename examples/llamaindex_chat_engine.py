"""A LlamaIndex chat engine (condense plus context) on a two-model ensemble, fully offline.

Each turn, the follow-up question is first rewritten into a standalone one from the chat
history (a generation of its own), passages are retrieved for it from `examples/documents/`,
and the answer is written from them and the history. Both generations run on `EnsembleLLM`
(Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE); the answers are streamed.

Run: `python examples/llamaindex_chat_engine.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from llama_index.core import SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.chat_engine.types import BaseChatEngine, ChatMode
from offline_embeddings import llamaindex_embeddings
from transformers.utils import logging as hf_logging

from llamaindex_ensemble import EnsembleLLM

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
DOCUMENTS = Path(__file__).parent / "documents"


def build_chat_engine(llm: EnsembleLLM, folder: Path = DOCUMENTS) -> BaseChatEngine:
    documents = SimpleDirectoryReader(str(folder)).load_data()
    index = VectorStoreIndex.from_documents(documents, embed_model=llamaindex_embeddings())
    return index.as_chat_engine(chat_mode=ChatMode.CONDENSE_PLUS_CONTEXT, llm=llm, similarity_top_k=1)


def main() -> None:
    hf_logging.disable_progress_bar()
    llm = EnsembleLLM(models=MODELS, method="safe", method_params={"drafter": "qwen"}, max_new_tokens=32)
    engine = build_chat_engine(llm)
    for message in ("When do skaters race on the Quillon river?", "And what does the winner get?"):
        print(f"User: {message}\nAssistant: ", end="")
        for token in engine.stream_chat(message).response_gen:
            print(token, end="", flush=True)
        print()


if __name__ == "__main__":
    main()
