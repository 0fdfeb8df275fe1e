"""LlamaIndex LLM backed by an ensemble-llm `Ensemble`: `EnsembleLLM`.

Install with `pip install 'ensemble-llm[llamaindex]'`.
"""

from ensemble_core.extras import require_extra

require_extra("llama_index.core", "llamaindex")

from llamaindex_ensemble.llm import EnsembleLLM  # noqa: E402

__all__ = ["EnsembleLLM"]
