"""Hostile input: thousands of seeded random requests to every route, and never a 500.

Each request starts from a valid one and is broken at random, in the ways clients and attackers
break them: a value replaced by another type, a huge number, a deep structure, a long or odd
string; keys dropped or added; the body's bytes truncated, flipped, made non-UTF-8 or made too
large; wrong methods and routes; missing, wrong and odd `Authorization`, `Content-Type` and
`X-Request-Id` headers. Every answer must be below 500, and every error from the API in OpenAI's
shape; afterwards the batch is empty and the server answers a well-formed request. (Requests
that stay valid generate, so the server's `max_tokens` is small.)
"""

from __future__ import annotations

import json
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from ensemble_core import Ensemble
from ensemble_core.serving.app import ServeSettings, create_app
from ensemble_core.serving.background import serving_in_thread
from reference import endless

KEY = "fuzz-key"
REQUESTS = 5008  # 313 per client
CLIENTS = 16  # a refused request's connection closes, and a new one waits on TCP's timers: clients overlap them
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/v1/nowhere", "/"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": "m", "prompt": "Once", "max_tokens": 2}


def odd_value(rng: random.Random) -> Any:
    """A value of the wrong type, size or depth."""
    depth = rng.randint(2, 300)
    pool = [
        None, True, 0, -1, 2**70, 1e308, -1e-308, "", "x" * rng.randint(1, 70_000), "\x00\u202e\ud800", "🙂" * 50,
        [], {}, [None] * rng.randint(1, 500), {"role": "system"}, {"type": "function"},
        json.loads("[" * depth + "]" * depth), _nested_object(depth), [{"role": "user", "content": [{"type": "x"}]}],
    ]  # fmt: skip
    return rng.choice(pool)


def _nested_object(depth: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for _ in range(depth):
        found = {"a": found}
    return found


def mutate(value: Any, rng: random.Random) -> Any:
    """The value with one random place in it broken."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        roll = rng.random()
        if roll < 0.2:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.3:
            return {**value, rng.choice(["tools", "stop", "n", "seed", "top_p", "zz", "stream"]): odd_value(rng)}
        return {**value, key: mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        index = rng.randrange(len(value))
        return [*value[:index], mutate(value[index], rng), *value[index + 1 :]]
    return odd_value(rng)


def body_of(route: str, rng: random.Random) -> bytes:
    start = COMPLETION if route == "/v1/completions" else CHAT
    value = start
    for _ in range(rng.randint(1, 3)):
        value = mutate(value, rng)
    data = json.dumps(value).encode()
    roll = rng.random()
    if roll < 0.1:
        return data[: rng.randrange(max(1, len(data)))]  # cut short
    if roll < 0.2:
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)  # not UTF-8, or not JSON
        return bytes(flipped)
    if roll < 0.23:
        return b"\xef\xbb\xbf" + data  # a byte-order mark
    if roll < 0.26:
        return b"[" * 100_000  # deep and large
    if roll < 0.28:
        return b"{" + b'"a":' * 20_000  # deep, and never closed
    return data


def headers_of(rng: random.Random) -> dict[str, str | bytes]:
    auth = rng.choice(
        [f"Bearer {KEY}"] * 6
        + ["", "Bearer", "Bearer wrong", f"Basic {KEY}", f"bearer {KEY}", f"Bearer  {KEY}", "Bearer " + "k" * 8000]
    )
    kind = rng.choice(["application/json"] * 5 + ["text/plain", "", "application/json; charset=latin-1", "multipart/x"])
    found: dict[str, str | bytes] = {"Authorization": auth, "Content-Type": kind}
    if rng.random() < 0.2:
        found["X-Request-Id"] = rng.choice(["a" * 500, "id with spaces", "ok-1", "\u00e9t\u00e9".encode("latin-1")])
    return {name: value for name, value in found.items() if value}


def one(client: httpx.Client, base: str, rng: random.Random) -> tuple[int, str]:
    route = rng.choice(ROUTES)
    method = "POST" if route in ROUTES[:2] and rng.random() < 0.85 else rng.choice(["GET", "POST", "PUT", "DELETE"])
    body = body_of(route, rng) if method in ("POST", "PUT") else b""
    headers = headers_of(rng)
    answer = client.request(method, base + route, content=body, headers=headers, timeout=60)
    problem = ""
    if answer.status_code >= 500:
        problem = f"{answer.status_code} for {method} {route}: {answer.text[:200]}"
    elif answer.status_code >= 400 and route != "/health":
        try:
            error = answer.json()["error"]
            assert isinstance(error["message"], str) and isinstance(error["type"], str)
        except (ValueError, KeyError, TypeError, AssertionError):
            problem = f"{answer.status_code} not in OpenAI's error shape: {answer.text[:200]}"
    return answer.status_code, problem


@pytest.fixture(scope="module")
def server(tiny_member):
    members = [endless(tiny_member("tiny-qwen2")), endless(tiny_member("tiny-llama"))]
    settings = ServeSettings(model_id="m", api_key=KEY, max_tokens=4, default_tokens=2, max_body_bytes=64 << 10)
    with Ensemble(members, method="gac") as ensemble:
        app = create_app(ensemble, settings)
        with serving_in_thread(app) as base_url:
            yield base_url.removesuffix("/v1"), app


def test_thousands_of_hostile_requests_get_no_500_and_errors_in_openai_shape(server) -> None:
    base, app = server

    def client_run(seed: int) -> tuple[Counter, list[str]]:
        rng = random.Random(seed)
        statuses: Counter = Counter()
        problems = []
        with httpx.Client() as client:
            for _ in range(REQUESTS // CLIENTS):
                status, problem = one(client, base, rng)
                statuses[status] += 1
                if problem:
                    problems.append(problem)
        return statuses, problems

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(client_run, range(CLIENTS)))
    statuses = sum((counts for counts, _ in results), Counter())
    problems = [problem for _, found in results for problem in found]
    assert sum(statuses.values()) == REQUESTS
    assert not problems, sorted(set(problems))[:20]
    assert {400, 401, 404, 405, 413} <= set(statuses), statuses  # each kind of refusal happened
    assert statuses[200] > 0, statuses  # and some requests stayed valid

    assert app.state.batcher.load == (0, 0)
    hello = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    after = httpx.post(f"{base}/v1/chat/completions", json=hello, headers={"Authorization": f"Bearer {KEY}"})
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3
