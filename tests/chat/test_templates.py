"""Prompt rendering with each member's own template, BOS once, end-of-sequence ids."""

from __future__ import annotations

import copy

import pytest
from conftest import packaged_member

from ensemble_core.chat.templates import render_prompt
from ensemble_core.errors import ConfigError, TemplateError

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"])
def test_messages_use_the_members_own_template_with_bos_once(name: str) -> None:
    member = packaged_member(name)
    tokenizer = member.tokenizer
    ids = member.render(MESSAGES).ids
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == expected
    if tokenizer.bos_token_id is not None:
        assert ids.count(tokenizer.bos_token_id) <= expected.count(tokenizer.bos_token)


def test_raw_prompt_gets_the_tokenizers_bos_exactly_once() -> None:
    gemma = packaged_member("gemma-3-270m")
    ids = gemma.render("Once upon a time").ids
    assert ids[0] == gemma.tokenizer.bos_token_id
    assert ids.count(gemma.tokenizer.bos_token_id) == 1


def test_messages_for_a_member_without_template_are_a_clear_error() -> None:
    with pytest.raises(TemplateError, match=r"'gemma-3-270m' has no chat template.*plain string prompt"):
        packaged_member("gemma-3-270m").render(MESSAGES)


def test_rendering_never_mutates_the_callers_messages() -> None:
    messages = copy.deepcopy(MESSAGES)
    packaged_member("qwen2.5-coder-0.5b-instruct").render(messages)
    assert messages == MESSAGES


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "empty list of messages"),
        ([{"content": "no role"}], "string 'role'"),
        (["just a string in a list"], "string 'role'"),
        (42, "must be a string .raw completion. or a list of messages"),
        (b"bytes", "must be a string"),
        ([{"role": "wizard", "content": "hi"}], r"`prompt\[0\]` has role 'wizard'; use one of \['system', 'user'"),
        ([{"role": "user", "content": None}], r"`prompt\[0\]` \(user\) has no content"),
        ([{"role": "user"}], r"has no content"),
        ("caf\udce9", "lone surrogate"),
        ([{"role": "user", "content": "ok \ud800"}], r"`prompt\[0\].content` holds '\\ud800'"),
    ],
)
def test_malformed_prompts_are_rejected_naming_the_field(prompt, message) -> None:
    with pytest.raises(ConfigError, match=message):
        render_prompt(packaged_member("qwen2.5-coder-0.5b-instruct").tokenizer, prompt, "qwen")


def test_an_assistant_turn_with_only_tool_calls_needs_no_content() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert packaged_member("qwen2.5-coder-0.5b-instruct").render(messages).ids


def test_template_leads_and_the_fixed_part_of_a_prompt_are_probed() -> None:
    qwen = packaged_member("qwen2.5-coder-0.5b-instruct")
    chat = qwen.render(MESSAGES)
    assert chat.fixed == len(chat.ids) and chat.lead == b""  # ChatML: the reply follows the template directly
    raw = packaged_member("gemma-3-270m").render("Once upon a time")
    assert raw.fixed == 1  # only <bos> is fixed: the rest may be re-read with the reply


def test_end_of_sequence_ids_come_from_config_tokenizer_and_template() -> None:
    qwen = packaged_member("qwen2.5-coder-0.5b-instruct")
    ids = {qwen.tokenizer.convert_ids_to_tokens(i) for i in qwen.eos_token_ids}
    assert ids == {"<|im_end|>", "<|endoftext|>"}
    smol = packaged_member("smollm2-135m-instruct")
    assert "<|im_end|>" in {smol.tokenizer.convert_ids_to_tokens(i) for i in smol.eos_token_ids}
    gemma = packaged_member("gemma-3-270m")
    assert "<eos>" in {gemma.tokenizer.convert_ids_to_tokens(i) for i in gemma.eos_token_ids}
