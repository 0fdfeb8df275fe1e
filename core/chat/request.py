"""One chat call as a front end (the LangChain and LlamaIndex adapters, the server) puts it to an ensemble.

`build_request` is the one place a call's options are read and checked: a front end converts
its messages and tools into the core's dicts and hands over its settings and the call's
keyword arguments; everything a user can get wrong fails here, as a `ConfigError` naming the
field and the fix, before any model work. The result, a `ChatRequest`, holds what
`Ensemble.stream`/`generate` need and what reading the reply needs (`chat.reply`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ensemble_core.chat.conversation import with_system_note
from ensemble_core.chat.templates import validate_tools
from ensemble_core.chat.tool_calls import plan_tools, resolve_tool_choice
from ensemble_core.config import GenerationSettings, build_settings
from ensemble_core.constraints import Constraint, JSONObject, JSONSchema
from ensemble_core.errors import ConfigError

SETTINGS = tuple(GenerationSettings.model_fields)
"""The generation settings a call may override (`max_new_tokens`, `stop`, `temperature`, ...)."""
CALL_OPTIONS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "model")
"""The other options a call may carry (see `build_request`)."""

PickTool = Callable[[list[dict[str, Any]], list[dict[str, Any]]], str]
"""`pick_tool(prompt, tools) -> name`: which of several tools a forced call calls (`Ensemble.pick_tool`)."""

_JSON_OBJECT_NOTE = "Reply with one JSON object and nothing else: no prose, no code fence."


@dataclass(frozen=True)
class ChatRequest:
    """What the core is asked for, and what reading the reply needs to know.

    Attributes:
        prompt: the conversation as the core's message dicts.
        settings: checked generation settings (`max_new_tokens`, `stop`, ...), stops for tools included.
        tools: OpenAI-style tool dicts offered to the members, or None.
        reply_prefix: the start of the reply the members are made to continue (a forced call's
            opening, or a JSON object's); the reply is read as `reply_prefix + result.text`.
        constraint: what the reply must match (a JSON schema, any JSON object, a forced call),
            when the ensemble's method honours constraints; then `reply_prefix` is "".
    """

    prompt: list[dict[str, Any]]
    settings: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    reply_prefix: str = ""
    constraint: Constraint | None = None

    @property
    def tool_names(self) -> list[str] | None:
        """The offered tools' names (None: no tools, so a call in the reply is reported invalid)."""
        return [t["function"]["name"] for t in self.tools] if self.tools else None

    @property
    def core_arguments(self) -> dict[str, Any]:
        """Keyword arguments for `Ensemble.generate`/`stream`/`agenerate`/`astream`."""
        shape = {} if self.constraint is None else {"constraint": self.constraint}
        return {"tools": self.tools, "reply_prefix": self.reply_prefix, **shape, **self.settings}


def build_request(
    messages: Sequence[Mapping[str, Any]],
    defaults: Mapping[str, Any],
    options: Mapping[str, Any],
    *,
    pick_tool: PickTool,
    served: str,
    caller: str,
    renamed: Mapping[str, str] | None = None,
    constrains: bool | Callable[[], bool] = False,
) -> ChatRequest:
    """The `ChatRequest` for one call; every option is checked before `pick_tool` or any model runs.

    Args:
        messages: the conversation as core message dicts (not changed).
        defaults: the front end's own settings by core name (`max_new_tokens`, `stop`, ...).
        options: the call's keyword arguments. Settings replace the defaults, except `stop`
            (a string or a list), which adds to theirs; `tools` (OpenAI-style dicts);
            `tool_choice` (None/"auto", "none", "any"/"required"/True, a tool name or
            `{"type": "function", "function": {"name": ...}}`); `parallel_tool_calls` (default
            True; False ends the reply after the first call); `response_format`
            (`{"type": "json_object"}`, `{"type": "json_schema", "schema": {...}}` or
            `{"type": "text"}`); `model` (only the name served). None means "not given".
        pick_tool: settles "any" of several tools before that call is forced (a small model
            left to write the name may invent one); called last, after every check.
        served: the model name the front end serves (the one `model` may be).
        caller: the front end's name for messages ("ChatEnsemble").
        renamed: the front end's own names for core options, e.g. `{"max_tokens": "max_new_tokens"}`
            (then `max_new_tokens` itself is unknown to that front end).
        constrains: whether the ensemble's method honours constraints (`Ensemble.constrains`),
            or a function that tells (asked after every check, like `pick_tool`): then a JSON
            `response_format`, a forced tool call and "auto" (text, or a well-formed call) are
            enforced by a grammar; otherwise they are asked for in the prompt and the reply is
            opened for the members.

    Raises:
        ConfigError: an unknown option or a bad value; the message names the field and the fix.
    """
    given = _core_names(options, caller, renamed or {})
    model = given.get("model")
    if model is not None and model != served:
        raise ConfigError(
            f"{caller} serves {served!r} and cannot switch to model={model!r} per call; "
            f"make another {caller} for other models."
        )
    settings = _settings(defaults, given)
    tools = validate_tools(given.get("tools"))
    choice = resolve_tool_choice(given.get("tool_choice"), [t["function"]["name"] for t in tools or []])
    parallel = given.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ConfigError(f"`parallel_tool_calls` has to be True, False or None, but is {parallel!r}.")
    note, opening = json_reply(given.get("response_format"))
    shape = json_constraint(given.get("response_format")) if opening else None
    if shape is not None:
        shape.grammar()  # an unsupported schema feature fails here, named
    if callable(constrains):
        constrains = constrains()
    shape = shape if constrains else None
    prompt = [dict(message) for message in messages]
    plan = plan_tools(
        tools,
        choice,
        parallel_calls=parallel is not False,
        stop=settings["stop"],
        pick_tool=lambda offered: pick_tool(prompt, offered),
        constrain=constrains,
    )
    if note:
        prompt = with_system_note(prompt, note)
    # a forced call comes first; "auto" (text or a call) unless the reply must be JSON, which wins
    if plan.reply_prefix or (plan.constraint is not None and (choice is not None or shape is None)):
        return ChatRequest(prompt, {**settings, "stop": plan.stop}, plan.tools, plan.reply_prefix, plan.constraint)
    if shape is not None:
        return ChatRequest(prompt, {**settings, "stop": plan.stop}, plan.tools, "", shape)
    return ChatRequest(prompt, {**settings, "stop": plan.stop}, plan.tools, opening)


def _core_names(options: Mapping[str, Any], caller: str, renamed: Mapping[str, str]) -> dict[str, Any]:
    """The options under their core names (None stays: for a setting it is a value, e.g. `seed=None`)."""
    names = {name: name for name in (*SETTINGS, *CALL_OPTIONS) if name not in renamed.values()}
    names.update(renamed)
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise ConfigError(f"{caller} got unknown call options {unknown}; known: {', '.join(sorted(names))}.")
    return {names[key]: value for key, value in options.items()}


def _settings(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults with the call's settings in, stops added up; checked (`build_settings`)."""
    settings = {**defaults, **{key: value for key, value in given.items() if key in SETTINGS}}
    settings["stop"] = list(dict.fromkeys([*_stops(defaults.get("stop")), *_stops(given.get("stop"))]))
    build_settings(**settings)
    return settings


def _stops(value: Any) -> list[Any]:
    """Stop strings as a list (each is checked by `build_settings`)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return list(value)
    raise ConfigError(f"`stop` has to be a string or a list of strings, but is {value!r}.")


def json_reply(response_format: Mapping[str, Any] | None) -> tuple[str, str]:
    """The system note asking for JSON, and the reply's forced opening ("", "" for plain text).

    A schema is described as its keys with their types: small models shown a raw JSON
    schema tend to echo its `title`/`properties` shape back. The opening writes the first
    key (and the quote of its value when that is a string), so the object starts right.

    Raises:
        ConfigError: `response_format` is not text, a JSON object or a JSON schema.
    """
    if response_format is None:
        return "", ""
    given = response_format if isinstance(response_format, Mapping) else {}
    kind = given.get("type")
    if kind == "text":
        return "", ""
    if kind == "json_object":
        return _JSON_OBJECT_NOTE, "{"
    nested = given.get("json_schema")
    schema = given.get("schema") or (nested.get("schema") if isinstance(nested, Mapping) else None)
    if kind != "json_schema" or not isinstance(schema, Mapping):
        raise ConfigError(
            "`response_format` has to be {'type': 'json_object'}, {'type': 'json_schema', 'schema': {...}} or "
            f"{{'type': 'text'}}, but is {response_format!r}."
        )
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return f"{_JSON_OBJECT_NOTE} It must follow this JSON schema:\n{json.dumps(schema)}", "{"
    listed = schema.get("required")
    required = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
    lines = [_key_line(key, spec, key in required) for key, spec in properties.items()]
    note = f"{_JSON_OBJECT_NOTE} The object has these keys:\n" + "\n".join(lines)
    first, first_spec = next(iter(properties.items()))
    string_value = isinstance(first_spec, Mapping) and first_spec.get("type") == "string"
    return note, '{"' + first + '": ' + ('"' if string_value else "")


def json_constraint(response_format: Mapping[str, Any]) -> Constraint:
    """The constraint of a JSON `response_format` (one `json_reply` accepted)."""
    if response_format.get("type") == "json_object":
        return JSONObject()
    nested = response_format.get("json_schema")
    schema = response_format.get("schema") or (nested.get("schema") if isinstance(nested, Mapping) else None)
    return JSONSchema(dict(schema))  # type: ignore[arg-type]


def _key_line(key: str, spec: Any, required: bool) -> str:
    kind = spec.get("type", "any") if isinstance(spec, Mapping) else "any"
    description = spec.get("description") if isinstance(spec, Mapping) else None
    return f'- "{key}": {kind}{"" if required else " (optional)"}{": " + description if description else ""}'
