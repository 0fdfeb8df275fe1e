"""A LlamaIndex query engine over a folder of documents, answered by a two-model ensemble.

`examples/documents/` is loaded with `SimpleDirectoryReader`, embedded offline with
all-MiniLM-L6-v2 (a PyPI package, no network) into a `VectorStoreIndex`, and each question is
answered by `EnsembleLLM` (Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE) from the retrieved
passage: once as a whole response, once streamed.

Run: `python examples/llamaindex_query_engine.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from llama_index.core import Settings, SimpleDirectoryReader, VectorStoreIndex
from offline_embeddings import llamaindex_embeddings
from transformers.utils import logging as hf_logging

from llamaindex_ensemble import EnsembleLLM

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
DOCUMENTS = Path(__file__).parent / "documents"


def build_index(folder: Path = DOCUMENTS) -> VectorStoreIndex:
    """Every file in `folder`, split into nodes and embedded with the offline model."""
    return VectorStoreIndex.from_documents(SimpleDirectoryReader(str(folder)).load_data())


def main() -> None:
    hf_logging.disable_progress_bar()
    Settings.llm = EnsembleLLM(models=MODELS, method="safe", method_params={"drafter": "qwen"}, max_new_tokens=48)
    Settings.embed_model = llamaindex_embeddings()
    index = build_index()

    response = index.as_query_engine(similarity_top_k=1).query("What colour is the Varnholt lighthouse?")
    print(f"Q: What colour is the Varnholt lighthouse?\nA: {response}")
    for source in response.source_nodes:
        print(f"   source: {source.node.metadata['file_name']} (score {source.score:.2f})")

    question = "How long is Brindle cheese aged?"
    print(f"Q: {question}\nA: ", end="")
    streaming = index.as_query_engine(similarity_top_k=1, streaming=True).query(question)
    for token in streaming.response_gen:
        print(token, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
