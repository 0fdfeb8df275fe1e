"""`ensemble-llm serve`: the ensemble behind an OpenAI-compatible HTTP API."""
