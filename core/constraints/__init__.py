"""Constrained decoding: replies that match a JSON schema, a regex, a choice or a grammar, for
every member at once (decisions are made on texts, so one byte-level grammar serves every
tokenizer). See docs/guides/constraints.md.

Example::

    from ensemble_core.constraints import JSONSchema
    ensemble.generate(prompt, constraint=JSONSchema({"type": "object", ...}))
"""

from ensemble_core.constraints.kinds import Choice, Constraint, Grammar, JSONObject, JSONSchema, Regex

__all__ = ["Choice", "Constraint", "Grammar", "JSONObject", "JSONSchema", "Regex"]
