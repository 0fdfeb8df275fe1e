"""Constrained replies: every reply that ends with "stop" matches its constraint, whatever the
members would rather write, for every method that honours constraints, greedy and sampled.

Tiny random-weight members (decisive and endless, on the real Qwen and SmolLM2 tokenizers)
would write anything: the grammar alone keeps them in line, which is the hard case. Then the
real packaged pair writes a schema's object. Methods that cannot honour a constraint refuse
it, and bad constraints fail before any model runs.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from conftest import packaged_member

from ensemble_core import Ensemble
from ensemble_core.constraints import Choice, Grammar, JSONObject, JSONSchema, Regex
from ensemble_core.errors import ConfigError
from ensemble_core.methods import SAFE, Contrastive, GaC, Single, SpecFuse, SweetSpan, UniTE
from reference import endless

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "東京", "Lima"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "choice": Choice(["yes", "no", "maybe not"]),
    "regex": Regex(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),  # \d: any Unicode digit (Rust regex)
    "schema": JSONSchema(PERSON),
    "grammar": Grammar('start: "ok" | "sum(" NUMBER ")"\n%import common.NUMBER'),
}
METHODS = {
    "gac": lambda: GaC(),
    "unite": lambda: UniTE(),
    "gate": lambda: GaC(threshold=0.5, primary="tiny-qwen2"),
    "contrastive": lambda: Contrastive(),
    "safe": lambda: SAFE(drafter="tiny-llama"),
    "single": lambda: Single(member="tiny-llama"),
}


def assert_matches(name: str, text: str) -> None:
    if name == "choice":
        assert text in CONSTRAINTS["choice"].options
    elif name == "regex":
        assert re.fullmatch(CONSTRAINTS["regex"].pattern, text)
    elif name == "schema":
        jsonschema.validate(json.loads(text), PERSON)
    else:
        # lark's common.NUMBER: an integer, or a decimal with digits on either side of the point ("95." too)
        assert text == "ok" or re.fullmatch(r"sum\((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\)", text)


@pytest.fixture(scope="module")
def tiny_pair(tiny_member):
    return [endless(tiny_member("tiny-qwen2")), endless(tiny_member("tiny-llama"))]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_every_finished_reply_matches_its_constraint(method: str, name: str, tiny_pair) -> None:
    ensemble = Ensemble(tiny_pair, method=METHODS[method]())
    prompts = ["Answer:", "The data: ", "你好"]
    for sampled in (False, True):
        settings = {"temperature": 0.9, "seed": 5} if sampled else {}
        results = ensemble.generate_batch(prompts, max_new_tokens=48, constraint=CONSTRAINTS[name], **settings)
        for result in results:
            assert result.finish_reason in ("stop", "length", "eos")
            if result.finish_reason == "length":  # cut inside: never closed silently, only a prefix
                continue
            assert_matches(name, result.text)
        assert any(r.finish_reason != "length" for r in results)


@pytest.mark.parametrize("method", ["gac", "single"])
def test_a_constraint_changes_the_text_only_where_the_grammar_must(method: str) -> None:
    """Greedy under a constraint the free reply already meets is the free reply: the constrained
    argmax is the argmax wherever the argmax is allowed."""
    qwen, smol = packaged_member("qwen2.5-coder-0.5b-instruct"), packaged_member("smollm2-135m-instruct")
    ensemble = Ensemble([qwen, smol], method=GaC()) if method == "gac" else Ensemble([qwen], method=Single())
    prompt = [{"role": "user", "content": "Reply with a JSON object with keys name (a string) and age (an integer)."}]
    free = ensemble.generate(prompt, max_new_tokens=24)
    anything = Regex(r"(?s:.*)")
    assert ensemble.generate(prompt, max_new_tokens=24, constraint=anything).text == free.text
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    result = ensemble.generate(prompt, max_new_tokens=40, constraint=JSONSchema(schema))
    assert result.finish_reason == "stop"
    jsonschema.validate(json.loads(result.text), schema)


@pytest.mark.parametrize("method", [SweetSpan(), SpecFuse()])
def test_a_method_without_a_rule_refuses_before_generating(method, tiny_pair) -> None:
    ensemble = Ensemble(tiny_pair, method=method)
    with pytest.raises(ConfigError, match=f"{type(method).__name__} cannot honour a constraint: .*Use GaC"):
        ensemble.generate("x", max_new_tokens=4, constraint=JSONObject())


def test_bad_constraints_fail_before_any_model_runs(tiny_pair) -> None:
    ensemble = Ensemble(tiny_pair, method=GaC())
    with pytest.raises(ConfigError, match=r"Unimplemented keys: \[\"not\"\]"):
        ensemble.generate("x", max_new_tokens=4, constraint=JSONSchema({"not": {"type": "string"}}))
    with pytest.raises(ConfigError, match="does not compile"):
        Regex("(unclosed").grammar()
    with pytest.raises(ConfigError, match="`constraint` has to be"):
        ensemble.generate("x", max_new_tokens=4, constraint={"type": "object"})
    with pytest.raises(ConfigError, match="`reply_prefix` and `constraint` do not combine"):
        ensemble.generate("x", max_new_tokens=4, constraint=JSONObject(), reply_prefix="{")
    with pytest.raises(ConfigError, match="non-empty option"):
        Choice([])
