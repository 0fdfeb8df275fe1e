"""What a reply must look like: JSON (any object, or one schema), a regex, one of some options,
or a Lark grammar. Each kind compiles to an llguidance grammar (docs/guides/constraints.md).

Why llguidance: it is the matcher vLLM, SGLang, llama.cpp and transformers use; it reads JSON
Schema, regexes and Lark directly; and it matches BYTES, token boundaries anywhere, so one
matcher serves every member of an ensemble whatever its tokenizer (XGrammar and Outlines-core
compile a grammar against ONE tokenizer's vocabulary). A schema feature it does not implement is
refused here, before any model runs, rather than silently ignored.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ensemble_core.errors import ConfigError


class Constraint(ABC):
    """A rule on the committed reply's bytes: a candidate text is allowed iff the grammar accepts
    it after what is committed; the end of text only where the grammar may end."""

    @abstractmethod
    def grammar(self) -> str:
        """The llguidance grammar (its JSON form), checked."""

    def describe(self) -> str:
        return type(self).__name__


def _checked(grammar: str, what: str) -> str:
    """The grammar, or a ConfigError naming what llguidance refused or would ignore."""
    from llguidance import LLMatcher

    failed, warnings = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed or warnings:
        found = "; ".join(warnings) if warnings else str(failed)
        raise ConfigError(
            f"The {what} cannot be enforced: {found}. Remove or rewrite that part (e.g. express "
            "`not` with an enum or a pattern), or generate without a constraint."
        )
    return grammar


@dataclass(frozen=True)
class JSONSchema(Constraint):
    """A JSON value valid under `schema` (a dict, a JSON string, or a pydantic model class).

    Example:
        >>> JSONSchema({"type": "object", "properties": {"name": {"type": "string"}}})  # doctest: +SKIP
    """

    schema: Any

    def as_dict(self) -> dict[str, Any]:
        schema = self.schema
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"The JSON schema is not valid JSON: {exc}. Pass a dict or a JSON string.") from exc
        if not isinstance(schema, dict):
            raise ConfigError(f"A JSON schema must be a dict, but is {type(schema).__name__}.")
        return schema

    def grammar(self) -> str:
        from llguidance import LLMatcher

        return _checked(LLMatcher.grammar_from_json_schema(self.as_dict(), defaults=_COMPACT), "JSON schema")


# Replies as JSON models write them: items separated by ", " or ",", keys by ": " or ":", no
# newlines inside (a small model that may indent loops on whitespace until it runs out of tokens).
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_rule(schema: dict[str, Any]) -> str:
    """A Lark rule body for a JSON value under `schema`, written compactly as `JSONSchema`
    writes it (for grammars that embed JSON, e.g. a tool call's arguments)."""
    return "%json " + json.dumps({**schema, "x-guidance": {**_COMPACT, **schema.get("x-guidance", {})}})


@dataclass(frozen=True)
class JSONObject(Constraint):
    """Any JSON object (OpenAI's `response_format={"type": "json_object"}`)."""

    def grammar(self) -> str:
        from llguidance import LLMatcher

        return _checked(LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_COMPACT), "JSON object")


@dataclass(frozen=True)
class Regex(Constraint):
    """Text that fully matches `pattern` (llguidance's regex syntax: Rust `regex`, no lookaround
    or backreferences)."""

    pattern: str

    def grammar(self) -> str:
        from llguidance import LLMatcher

        if not isinstance(self.pattern, str) or not self.pattern:
            raise ConfigError("`Regex` needs a non-empty pattern string.")
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"The regex {self.pattern!r} does not compile: {exc}.") from exc
        return _checked(LLMatcher.grammar_from_regex(self.pattern), f"regex {self.pattern!r}")


@dataclass(frozen=True)
class Choice(Constraint):
    """Exactly one of `options` (strings)."""

    options: Sequence[str]

    def __post_init__(self) -> None:
        options = tuple(self.options) if not isinstance(self.options, str) else ()
        if not options or not all(isinstance(o, str) and o for o in options):
            raise ConfigError("`Choice` needs a list of non-empty option strings.")
        object.__setattr__(self, "options", options)

    def grammar(self) -> str:
        from llguidance import LLMatcher

        return _checked(LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, self.options))), "choice")


@dataclass(frozen=True)
class Grammar(Constraint):
    """Text in the language of a Lark grammar (llguidance's Lark dialect; `start` is the rule)."""

    lark: str

    def grammar(self) -> str:
        from llguidance import LLMatcher

        if not isinstance(self.lark, str) or "start" not in self.lark:
            raise ConfigError("`Grammar` needs Lark text with a `start` rule.")
        return _checked(LLMatcher.grammar_from_lark(self.lark), "grammar")
