"""LangChain chat model backed by an ensemble-llm `Ensemble`: `ChatEnsemble`.

Install with `pip install 'ensemble-llm[langchain]'`.
"""

from ensemble_core.extras import require_extra

require_extra("langchain_core", "langchain")

from langchain_ensemble.chat_model import ChatEnsemble  # noqa: E402

__all__ = ["ChatEnsemble"]
