"""LangChain's own standard test suites, run against a real packaged ensemble.

Qwen2.5-Coder 0.5B + SmolLM2 135M: two tokenizers, two chat templates (Qwen's renders tools,
SmolLM2's does not), all on the CPU. The unit suite (no generation) configures SAFE; the
integration suite generates under the gate (GaC consulting SmolLM2 where Qwen is unsure),
the cheapest ensemble that still combines both members: the adapter's path is the same for
every method, and SAFE through the adapter runs in test_langchain_chat.py and the examples.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_ensemble import ChatEnsemble

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
# Equal weights, said explicitly: the standard suite's replies were checked with them (the front
# ends' default, "auto", is tested in tests/test_loading.py and runs in the docs' snippets).
ENSEMBLE = {"models": MODELS, "method": "safe", "method_params": {"drafter": "qwen", "weights": "equal"}}
GATE = {
    "models": MODELS,
    "method": "gac",
    "method_params": {"threshold": 0.5, "primary": "qwen", "weights": "equal"},
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


# The integration tests that only need SOME reply (a message, chunks, usage, a stop, the round
# trip of a history): a whole reply adds nothing to what they check, so they get a short one.
# The rest (tool calls, structured output, JSON, agents) parse what the model writes and keep 40.
SOME_REPLY_TESTS = {
    "test_invoke",
    "test_ainvoke",
    "test_stream",
    "test_astream",
    "test_batch",
    "test_abatch",
    "test_conversation",
    "test_double_messages_conversation",
    "test_usage_metadata",
    "test_usage_metadata_streaming",
    "test_stop_sequence",
    "test_message_with_name",
    "test_stream_events_v3",
    "test_astream_events_v3",
    "test_tool_message_histories_string_content",
    "test_tool_message_histories_list_content",
    "test_tool_message_error_status",
}


class TestChatEnsembleIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatEnsemble]:
        return ChatEnsemble

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {**GATE, "max_tokens": 40}

    @pytest.fixture
    def model(self, request: pytest.FixtureRequest) -> BaseChatModel:
        """The suite's own fixture, with `max_tokens` 12 for the tests in `SOME_REPLY_TESTS`."""
        extra = getattr(request, "param", None) or {}
        short = {"max_tokens": 12} if request.node.originalname in SOME_REPLY_TESTS else {}
        return ChatEnsemble(**{**self.standard_chat_model_params, **self.chat_model_params, **short, **extra})

    @property
    def supports_json_mode(self) -> bool:
        return True
