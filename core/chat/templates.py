"""A prompt (raw text or a conversation) -> one member's own prompt token ids.

Every member renders the conversation with ITS OWN chat template: the ensemble never writes
a template by hand, and members with different templates see the same conversation in
their own format. Rules:

* a `str` prompt is raw completion: the tokenizer's own special tokens (e.g. Gemma's `<bos>`)
  are added, no template is applied;
* a list of messages goes through the member's chat template with the generation prompt;
* BOS appears exactly once: the template's text is encoded without special tokens, and the
  tokenizer's BOS is put in front only if the tokenizer normally adds one and the template
  did not already write it.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import jinja2

from ensemble_core.chat.conversation import fit_conversation, merge_consecutive_roles, text_content
from ensemble_core.errors import ConfigError, TemplateError
from ensemble_core.members.contract import RenderedPrompt

Message: TypeAlias = Mapping[str, Any]
Prompt: TypeAlias = str | Sequence[Message]
Tools: TypeAlias = Sequence[Mapping[str, Any]] | None


ROLES = ("system", "user", "assistant", "tool")


def check_text(value: str, where: str) -> None:
    """Reject text that is not valid Unicode (a lone surrogate cannot become UTF-8 bytes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigError(
            f"`{where}` holds {value[error.start : error.end]!r} at position {error.start}, a lone surrogate that is "
            "not valid Unicode; decode your input with errors='replace' (or fix the source) first."
        ) from None


def validate_prompt(prompt: Any, where: str = "prompt") -> None:
    """Reject a prompt that no member could render, before any model work."""
    if isinstance(prompt, str):
        check_text(prompt, where)
        return
    if not isinstance(prompt, Sequence) or isinstance(prompt, bytes):
        raise ConfigError(
            f"`{where}` must be a string (raw completion) or a list of messages "
            f"({{'role': ..., 'content': ...}}), but is {type(prompt).__name__}."
        )
    if len(prompt) == 0:
        raise ConfigError(f"`{where}` is an empty list of messages; give at least one message.")
    for index, message in enumerate(prompt):
        _validate_message(message, f"{where}[{index}]")


def _validate_message(message: Any, where: str) -> None:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ConfigError(
            f"`{where}` must be a mapping with a string 'role' (and usually 'content'), but is {message!r:.80}."
        )
    role = message["role"]
    if role not in ROLES:
        raise ConfigError(f"`{where}` has role {role!r}; use one of {list(ROLES)}.")
    content = message.get("content")
    if content is None and not (role == "assistant" and message.get("tool_calls")):
        raise ConfigError(
            f"`{where}` ({role}) has no content; give it a string (only an assistant turn with tool_calls may "
            "leave content out)."
        )
    if isinstance(content, str):
        check_text(content, f"{where}.content")
    elif content is not None:
        if not isinstance(content, Sequence) or isinstance(content, bytes):
            raise ConfigError(
                f"`{where}.content` must be a string or a list of text parts, but is {type(content).__name__}."
            )
        for part_index, part in enumerate(content):
            text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) else None
            if isinstance(text, str):
                check_text(text, f"{where}.content[{part_index}]")


def prompt_text(prompt: Prompt) -> str:
    """A prompt as plain text, without any template: a raw string as it is, a conversation's
    message contents joined by blank lines (what prompt-based member weights score)."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(
        text
        for index, message in enumerate(prompt)
        if (text := text_content(message.get("content"), f"prompt[{index}]"))
    )


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI-style tool definitions (`{"type": "function", "function": {"name", ...}}`), checked."""
    if tools is None or (isinstance(tools, Sequence) and len(tools) == 0):
        return None
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise ConfigError(f"`tools` must be a list of tool definitions, but is {type(tools).__name__}.")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ConfigError(
                f"`tools[{index}]` must look like {{'type': 'function', 'function': {{'name': ..., "
                f"'description': ..., 'parameters': {{...}}}}}}, but is {tool!r:.80}."
            )
        _check_nested_text(tool, f"tools[{index}]")
    return [dict(t) for t in tools]


def _check_nested_text(value: Any, where: str) -> None:
    """`check_text` on every string of a JSON-like value: a template writes all of a tool's
    keys and values into the prompt, where a lone surrogate would fail inside the tokenizer."""
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_nested_text(key, where)
            _check_nested_text(item, f"{where}[{key!r}]")
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        for position, item in enumerate(value):
            _check_nested_text(item, f"{where}[{position}]")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def adds_bos(tokenizer: Any) -> bool:
    """Whether plain encoding puts the tokenizer's BOS in front (probed, not assumed)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer.encode("a", add_special_tokens=True)
    return bool(ids) and ids[0] == bos


def render_prompt(
    tokenizer: Any,
    prompt: Prompt,
    member_name: str,
    tools: Tools = None,
    reply_prefix: str = "",
) -> RenderedPrompt:
    """The member's prompt for `prompt` (see the module docstring for the rules).

    `reply_prefix` is encoded (without special tokens) after the generation prompt, so the
    member continues from it. The result says which ids may be re-read with the reply under
    prompt-boundary correction (`fixed`): after the last special token of a raw prompt, or
    after the generation prompt of a chat template (the template defines those tokens). Where
    a template writes a separator before the reply (Llama-2's space after `[/INST]`), that
    separator is the member's `lead`: its first token spells it, and it is not reply text.

    Raises:
        TemplateError: messages were given but the member has no chat template, or its
            template rejected the conversation (the template's own message is kept).
    """
    validate_prompt(prompt)
    if isinstance(prompt, str):
        if tools:
            raise TemplateError(
                f"Tools need a conversation: member {member_name!r} got a raw string prompt. "
                "Pass a list of messages instead."
            )
        ids = list(tokenizer.encode(prompt, add_special_tokens=True))
        fixed = _after_last_special(tokenizer, ids)
        return RenderedPrompt(ids + _encode_plain(tokenizer, reply_prefix), fixed)
    if not has_chat_template(tokenizer):
        raise TemplateError(
            f"Member {member_name!r} has no chat template, so it cannot take a list of messages. "
            "Pass a plain string prompt (raw completion), or load the member with "
            "`chat_template=...` (a Jinja template string)."
        )
    messages, template_tools = fit_conversation(tokenizer, copy.deepcopy(list(prompt)), tools)
    text = _apply_template(tokenizer, messages, template_tools, member_name)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = getattr(tokenizer, "bos_token_id", None)
    if adds_bos(tokenizer) and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    lead = reply_lead(tokenizer)
    if reply_prefix:
        return RenderedPrompt(ids + _encode_plain(tokenizer, lead + reply_prefix), len(ids))
    return RenderedPrompt(ids, len(ids), lead.encode())


def _after_last_special(tokenizer: Any, ids: list[int]) -> int:
    special = special_ids(tokenizer)
    last = max((k for k, token in enumerate(ids) if token in special), default=-1)
    return last + 1


_SPECIAL: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's special (control) ids, read once (`added_tokens_decoder` is slow)."""
    found = _SPECIAL.get(tokenizer)
    if found is None:
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        special |= {i for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items() if t.special}
        found = frozenset(special)
        _SPECIAL[tokenizer] = found
    return found


_LEADS: dict[str, str] = {}


def reply_lead(tokenizer: Any) -> str:
    """Whitespace a chat template writes between the generation prompt and the reply's text.

    Probed by rendering a reply: ChatML and Gemma templates write none; Llama-2's writes a
    space after `[/INST]`, which the model's first reply token spells (as `▁Hello`). Only
    whitespace counts: other text between the two is template structure we do not guess at.
    """
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if template not in _LEADS:
        _LEADS[template] = _probe_lead(tokenizer)
    return _LEADS[template]


def _probe_lead(tokenizer: Any) -> str:
    marker = "ZqXleadQz"
    user = [{"role": "user", "content": "hi"}]
    try:
        opening = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        whole = tokenizer.apply_chat_template(
            [*user, {"role": "assistant", "content": marker}], add_generation_prompt=False, tokenize=False
        )
    except (jinja2.TemplateError, TypeError, ValueError, KeyError):
        return ""
    if not isinstance(opening, str) or not isinstance(whole, str) or not whole.startswith(opening):
        return ""
    between = whole[len(opening) : whole.find(marker)] if marker in whole else ""
    return between if between and not between.strip() else ""


def _encode_plain(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _apply_template(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, member_name: str
) -> str:
    """The template's text; runs of one role are merged only if the template rejects them."""

    def apply(conversation: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)

    try:
        return apply(messages)
    except Exception as error:  # Jinja raises TemplateError, TypeError, ... depending on the template
        rejection = error
    merged = merge_consecutive_roles(messages)
    if len(merged) < len(messages):
        with contextlib.suppress(Exception):  # if merging does not help, the first rejection is the one to report
            return apply(merged)
    raise TemplateError(
        f"The chat template of member {member_name!r} rejected the conversation: {rejection}"
    ) from rejection


def chat_end_token_ids(tokenizer: Any) -> set[int]:
    """Special tokens the chat template writes right after an assistant turn (`<|im_end|>`).

    Found by rendering a tiny conversation, so no template or model name is hard-coded.
    """
    if not has_chat_template(tokenizer):
        return set()
    marker = "ZqXmarkerQz"
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except (jinja2.TemplateError, TypeError, ValueError, KeyError):
        return set()  # a template that insists on more (tools, a system turn) reveals nothing here
    if marker not in text:
        return set()
    after = text.split(marker, 1)[1]
    ids = tokenizer.encode(after, add_special_tokens=False)[:1]
    return {i for i in ids if i in special_ids(tokenizer)}
