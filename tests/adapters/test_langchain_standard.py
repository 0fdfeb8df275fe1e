"""LangChain's own standard test suites, run against a real packaged ensemble.

Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE (Qwen drafts, both verify): two tokenizers,
two chat templates (Qwen's renders tools, SmolLM2's does not), all on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_ensemble import ChatEnsemble

ENSEMBLE = {
    "models": ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"],
    "method": "safe",
    "method_params": {"drafter": "qwen"},
}


class TestChatEnsembleUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatEnsemble]:
        return ChatEnsemble

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return ENSEMBLE

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # Local models take no API key, and ChatEnsemble rejects keywords it does not know
        # (a misspelt setting must not vanish), so the suite's `api_key="test"` is left out.
        params = dict(super().standard_chat_model_params)
        params.pop("api_key")
        return params

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.mark.xfail(
        reason="langchain-core's load() revives only the classes in its own allowlist (langchain_core.load.mapping), "
        "which a third-party package cannot join; dumpd() itself works and matches the snapshot",
        strict=True,
        raises=ValueError,
    )
    def test_serdes(self, model: BaseChatModel, snapshot: Any) -> None:
        super().test_serdes(model, snapshot)


class TestChatEnsembleIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatEnsemble]:
        return ChatEnsemble

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {**ENSEMBLE, "max_tokens": 40}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.mark.xfail(
        reason="json_mode gives no schema; greedy Qwen2.5-Coder 0.5B + SmolLM2 135M loop on 'A cat is a cat, ...' "
        "inside the setup and run out of tokens before the punchline (json_schema works: test_structured_output)",
        strict=False,
    )
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)
