"""Conversations fitted to each member's template: tools, tool calls, tool results, role runs."""

from __future__ import annotations

import copy

import pytest
from conftest import packaged_member

from ensemble_core.chat.conversation import (
    TemplateAbilities,
    fit_conversation,
    template_abilities,
    text_content,
    with_system_note,
)
from ensemble_core.errors import ConfigError, TemplateError

QWEN, SMOL = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "c1", "name": "get_weather"},
]


def rendered_text(name: str, messages, tools=None) -> str:
    member = packaged_member(name)
    return member.tokenizer.decode(member.render(messages, tools).ids)


def test_abilities_are_probed_from_the_templates() -> None:
    assert template_abilities(packaged_member(QWEN).tokenizer) == TemplateAbilities(True, True, True)
    assert template_abilities(packaged_member(SMOL).tokenizer) == TemplateAbilities(False, False, True)


def test_a_template_that_renders_tools_gets_them_untouched() -> None:
    tokenizer = packaged_member(QWEN).tokenizer
    expected = tokenizer.apply_chat_template(HISTORY, tools=[TOOL], add_generation_prompt=True, tokenize=False)
    assert rendered_text(QWEN, HISTORY, [TOOL]) == expected


def test_a_template_that_drops_tools_gets_them_in_the_system_message_in_the_parsed_format() -> None:
    text = rendered_text(SMOL, HISTORY, [TOOL])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system")
    assert '"name": "get_weather"' in system and "<tool_call>" in system
    # the assistant's call, which the template would drop, is kept as text in the turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "Sunny, 21 C" in text


def test_the_system_note_joins_an_existing_system_message() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    noted = with_system_note(messages, "Reply in JSON.")
    assert noted[0] == {"role": "system", "content": "Be brief.\n\nReply in JSON."}
    assert messages[0]["content"] == "Be brief."
    assert with_system_note(messages[1:], "X")[0] == {"role": "system", "content": "X"}


STRICT_TEMPLATE = (
    "{% for m in messages %}{% if loop.index0 > 0 and messages[loop.index0 - 1]['role'] == m['role'] %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def strict_tokenizer():
    tokenizer = copy.copy(packaged_member(SMOL).tokenizer)
    tokenizer.chat_template = STRICT_TEMPLATE
    return tokenizer


def test_runs_of_one_role_are_merged_only_when_the_template_rejects_them(strict_tokenizer) -> None:
    from ensemble_core.chat.templates import render_prompt

    runs = [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "third"},
    ]
    text = strict_tokenizer.decode(render_prompt(strict_tokenizer, runs, "strict").ids)
    assert "<|im_start|>user\nfirst\n\nsecond<|im_end|>" in text
    lenient = packaged_member(SMOL).tokenizer
    text = lenient.decode(render_prompt(lenient, runs, "smol").ids)
    assert "<|im_start|>user\nfirst<|im_end|>\n<|im_start|>user\nsecond" in text


def test_a_rejection_merging_cannot_fix_keeps_the_templates_message(strict_tokenizer) -> None:
    from ensemble_core.chat.templates import render_prompt

    strict_tokenizer.chat_template = "{{ raise_exception('Only user turns, please') }}"
    with pytest.raises(TemplateError, match="Only user turns, please"):
        render_prompt(strict_tokenizer, [{"role": "user", "content": "hi"}], "strict")


def test_text_parts_are_joined_and_other_parts_are_refused() -> None:
    parts = [
        {"type": "text", "text": "Look:"},
        "plain",
        {"type": "tool_use", "id": "x"},
        {"type": "text", "text": "ok"},
    ]
    assert text_content(parts, "m") == "Look:\nplain\nok"
    with pytest.raises(ConfigError, match=r"part 1 is of type 'image_url'.*text only"):
        text_content([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}], "m")


def test_fitting_never_changes_the_callers_messages() -> None:
    before = copy.deepcopy(HISTORY)
    fit_conversation(packaged_member(SMOL).tokenizer, HISTORY, [TOOL])
    assert before == HISTORY
