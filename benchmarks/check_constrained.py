"""Do constrained replies hold? 30+ schemas, regexes and choices over the packaged ensembles.

Every case is a prompt and a constraint of our own (nested objects, arrays, enums, bounded
numbers, optional fields, non-ASCII strings, regexes, choices), none tuned to the members. Each
runs over the pair (Qwen2.5-Coder-0.5B + SmolLM2) and the trio (+ Gemma-3-270M, raw prompts:
it has no chat template), greedy and sampled, under the gate (GaC with a threshold) unless
`--method` says otherwise. A reply that finishes with "stop" must parse and validate (JSON),
full-match (regex) or be an option (choice); replies cut by the token limit are counted apart.

    python benchmarks/check_constrained.py [--sets pair trio] [--tokens 64] [--method gate|gac|safe]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
SETS = {"pair": (QWEN, SMOL), "trio": (QWEN, SMOL, GEMMA)}


def obj(required: list[str] | None = None, closed: bool = True, **properties: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"type": "object", "properties": properties, "required": required or list(properties)}
    if closed:
        found["additionalProperties"] = False
    return found


STRING, INT, BOOL, NUMBER = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("A person with a name and an age.", obj(name=STRING, age={"type": "integer", "minimum": 0, "maximum": 130})),
    ("A book: title, author, year.", obj(title=STRING, author=STRING, year={"type": "integer", "minimum": 1400})),
    ("The weather in Paris today.", obj(city=STRING, celsius=NUMBER, sky={"enum": ["sunny", "cloudy", "rain"]})),
    ("A shopping list of three items.", obj(items={"type": "array", "items": STRING, "minItems": 3, "maxItems": 3})),
    ("A point in 3D space.", obj(x=NUMBER, y=NUMBER, z=NUMBER)),
    ("A user account; the email is optional.", obj(["login"], login=STRING, email=STRING, admin=BOOL)),
    ("A Japanese city and its name in Japanese.", obj(city=STRING, native={"type": "string", "minLength": 1})),
    ("A French sentence with its English translation.", obj(fr=STRING, en=STRING)),
    ("A pet: species is cat, dog or fish.", obj(name=STRING, species={"enum": ["cat", "dog", "fish"]})),
    ("A rectangle's width and height in cm.", obj(width={"type": "number", "exclusiveMinimum": 0}, height=NUMBER)),
    (
        "An order with a customer and two lines.",
        obj(
            customer=obj(name=STRING, vip=BOOL),
            lines={"type": "array", "items": obj(sku=STRING, qty={"type": "integer", "minimum": 1}), "maxItems": 2},
        ),
    ),
    (
        "A HTTP response: status and headers.",
        obj(
            status={"type": "integer", "minimum": 100, "maximum": 599},
            headers={"type": "object", "additionalProperties": STRING},
        ),
    ),
    ("A movie rating from 1 to 5 stars.", obj(movie=STRING, stars={"type": "integer", "minimum": 1, "maximum": 5})),
    (
        "A color in RGB.",
        obj(
            r={"type": "integer", "minimum": 0, "maximum": 255},
            g={"type": "integer", "minimum": 0, "maximum": 255},
            b={"type": "integer", "minimum": 0, "maximum": 255},
        ),
    ),
    ("A to-do item; done is optional.", obj(["task"], task=STRING, done=BOOL)),
    (
        "A country with its capital and languages.",
        obj(country=STRING, capital=STRING, languages={"type": "array", "items": STRING, "maxItems": 4}),
    ),
    ("A boolean answer: is water wet?", obj(answer=BOOL, reason=STRING)),
    (
        "A recipe name with its ingredients.",
        obj(
            name=STRING,
            ingredients={
                "type": "array",
                "items": obj(name=STRING, grams={"type": "integer", "minimum": 0}),
                "maxItems": 3,
            },
        ),
    ),
    (
        "A date split into parts.",
        obj(
            year=INT,
            month={"type": "integer", "minimum": 1, "maximum": 12},
            day={"type": "integer", "minimum": 1, "maximum": 31},
        ),
    ),
    ("Any JSON object about the moon.", {"type": "object"}),
    (
        "A list of two Greek letters.",
        {"type": "array", "items": {"enum": ["α", "β", "γ", "δ"]}, "minItems": 2, "maxItems": 2},
    ),
    ("A temperature reading with a unit.", obj(value=NUMBER, unit={"enum": ["C", "F", "K"]})),
    ("A song with a nullable album.", obj(title=STRING, album={"type": ["string", "null"]})),
    ("A server config.", obj(host=STRING, port={"type": "integer", "minimum": 1, "maximum": 65535}, tls=BOOL)),
]
REGEXES: list[tuple[str, str]] = [
    ("Give a US phone number.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("Give today's date as YYYY-MM-DD.", r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"),
    ("Give an email address.", r"[a-z]{1,12}@[a-z]{1,12}\.(com|org|net)"),
    ("Give a hex colour code.", r"#[0-9a-f]{6}"),
]
CHOICES: list[tuple[str, list[str]]] = [
    ("Is the sky blue? Answer yes or no.", ["yes", "no"]),
    ("Which is a fruit: apple, car or chair?", ["apple", "car", "chair"]),
    ("The sentiment of 'I love this!':", ["positive", "negative", "neutral"]),
    ("Pick the largest planet.", ["Jupiter", "Mars", "Mercury", "木星"]),
]


def cases() -> list[tuple[str, Any, Any]]:
    from ensemble_core.constraints import Choice, JSONSchema, Regex

    found = [(f"{text} Reply in JSON.", JSONSchema(schema), ("json", schema)) for text, schema in SCHEMAS]
    found += [(text, Regex(pattern), ("regex", pattern)) for text, pattern in REGEXES]
    found += [(text, Choice(options), ("choice", options)) for text, options in CHOICES]
    return found


def holds(kind: tuple[str, Any], text: str) -> bool:
    import jsonschema

    if kind[0] == "regex":
        return re.fullmatch(kind[1], text) is not None
    if kind[0] == "choice":
        return text in kind[1]
    try:
        jsonschema.validate(json.loads(text), kind[1])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--method", choices=["gate", "gac", "safe"], default="gate")
    args = parser.parse_args()

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.methods import SAFE, GaC

    method = {"gate": GaC(threshold=0.5, primary=QWEN), "gac": GaC(), "safe": SAFE(drafter=QWEN)}[args.method]
    all_cases = cases()
    print(f"{len(all_cases)} cases, method {args.method}, up to {args.tokens} tokens")
    print("| members | decoding | stopped | held | cut by the limit | failed | seconds |")
    print("|---|---|---|---|---|---|---|")
    for label in args.sets:
        members = [HFMember.from_pretrained(name) for name in SETS[label]]
        ensemble = Ensemble(members, method=method)
        for decoding, settings in (("greedy", {}), ("sampled", {"temperature": 0.8, "seed": 7})):
            stopped = held = cut = 0
            failures = []
            started = time.perf_counter()
            for text, constraint, kind in all_cases:
                prompt = text if label == "trio" else [{"role": "user", "content": text}]
                result = ensemble.generate(prompt, constraint=constraint, max_new_tokens=args.tokens, **settings)
                if result.finish_reason == "length":
                    cut += 1
                    continue
                stopped += 1
                if holds(kind, result.text):
                    held += 1
                else:
                    failures.append((text, result.text))
            seconds = time.perf_counter() - started
            row = f"| {label} | {decoding} | {stopped} | {held} | {cut} | {len(failures)} | {seconds:.0f} |"
            print(row, flush=True)
            for text, reply in failures:
                print(f"    FAILED {text!r}: {reply!r}")


if __name__ == "__main__":
    main()
