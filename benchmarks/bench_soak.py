"""The server under a long mixed load, faults and hostile input: nothing lost, nothing leaked.

A real server on loopback (`create_app` served by uvicorn in this process) takes `--requests`
requests from `--clients` concurrent clients, a seeded mix of: chat and completions, whole and
streamed; forced tool calls and JSON replies; clients that disconnect mid-stream; requests
that run past the server's timeout; and malformed requests (junk bodies, wrong types, deep
JSON, non-UTF-8, oversized, bad keys, unknown routes). Every answer is checked against what
its kind must get (200 with a whole reply or a stream that ends with [DONE], or 504 when the
load kept it past the server's timeout; 504 for the long ones; a 4xx in OpenAI's error shape
for malformed ones; never a 500; a forced tool call is a call unless `max_tokens` cut it).
Printed: answers by kind and status, what went wrong, p50/p95 latency of the generating
requests, tokens/s, and the process's RSS and thread count at the start, after each quarter of
the requests and at the end (a leak grows every quarter; an allocator's warm-up levels off).

The members are two tiny random-weight models on the real Qwen and SmolLM2 tokenizers (the
server's work, not the models', is under test), under GaC by default.

    python benchmarks/bench_soak.py [--requests 1000] [--clients 16] [--method gac] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

KEY = "soak-key"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
KINDS = {  # kind -> share of the requests
    "chat": 0.22,
    "chat_stream": 0.18,
    "completion": 0.08,
    "completion_stream": 0.06,
    "tool_call": 0.06,
    "json": 0.06,
    "disconnect": 0.08,
    "timeout": 0.04,
    "malformed": 0.22,
}


def tiny_members() -> list[Any]:
    """Two tiny random-weight models on the packaged Qwen and SmolLM2 tokenizers (seeded), made
    decisive and endless (output rows x30, end rows zero), so every reply runs to its
    `max_tokens` and a long one surely runs past the server's timeout."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from ensemble_core import HFMember
    from ensemble_core.packaged import model_path

    found = []
    for name, (config_class, model_class) in {
        "qwen2.5-coder-0.5b-instruct": (Qwen2Config, Qwen2ForCausalLM),
        "smollm2-135m-instruct": (LlamaConfig, LlamaForCausalLM),
    }.items():
        tokenizer = AutoTokenizer.from_pretrained(model_path(name))
        config = config_class(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=len(tokenizer),
            max_position_embeddings=4096,
        )
        torch.manual_seed(0)
        model = model_class(config).float()
        member = HFMember(model, tokenizer, name=f"tiny-{name.split('-')[0]}")
        with torch.no_grad():
            head = model.get_output_embeddings().weight
            head.mul_(30.0)
            head[sorted(member.eos_token_ids)] = 0.0
        found.append(member)
    return found


@dataclass
class Report:
    """What a soak found."""

    answers: Counter = field(default_factory=Counter)  # (kind, status) -> count
    problems: list[str] = field(default_factory=list)  # answers a kind must not get
    latencies: list[float] = field(default_factory=list)  # generating requests that completed
    tokens: int = 0
    seconds: float = 0.0
    state_after: tuple[float, int] = (0.0, 0)  # (RSS MB, threads) when the requests were answered

    def add(self, kind: str, status: int | str, problem: str | None = None) -> None:
        self.answers[kind, status] += 1
        if problem:
            self.problems.append(f"{kind}: {problem}")


def malformed(rng: random.Random, base: str) -> tuple[str, str, dict[str, str], bytes]:
    """(method, url, headers, body) of one hostile request."""
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    route = rng.choice(["/chat/completions", "/completions"])
    message = {"role": "user", "content": "hi"}
    bodies: list[Callable[[], tuple[dict[str, str], bytes]]] = [
        lambda: (auth, b"{not json"),
        lambda: (auth, b"\xff\xfe\x00garbage"),
        lambda: (auth, b"[" * 5000 + b"]" * 5000),
        lambda: (auth, json.dumps({"model": "m", "messages": "hello"}).encode()),
        lambda: (auth, json.dumps({"model": "m", "messages": [{"role": 7}]}).encode()),
        lambda: (auth, json.dumps({"model": "m", "messages": [message], "max_tokens": "ten"}).encode()),
        lambda: (auth, json.dumps({"model": "m", "messages": [message], "temperature": [1]}).encode()),
        lambda: (auth, json.dumps({"model": "m", "prompt": {"x": 1}}).encode()),
        lambda: (auth, json.dumps({"model": "m", "messages": [message], "tools": "all"}).encode()),
        lambda: (auth, json.dumps({"model": "m", "messages": [message], "response_format": {"type": "xml"}}).encode()),
        lambda: (auth, json.dumps({"model": "m", "messages": [message], "n": 3}).encode()),
        lambda: ({**auth, "Authorization": "Bearer wrong"}, json.dumps({"model": "m", "messages": [message]}).encode()),
        lambda: ({"Content-Type": "application/json"}, json.dumps({"model": "m", "messages": [message]}).encode()),
        lambda: (auth, b"x" * (2 << 20)),
        lambda: (auth, json.dumps({"model": "m", "messages": [message], "stop": [""] * 3}).encode()),
        lambda: (auth, json.dumps(["a", 1, None]).encode()),
        lambda: (auth, b"null"),
    ]
    headers, body = rng.choice(bodies)()
    if rng.random() < 0.1:
        return "GET", base + rng.choice(["/nowhere", "/chat/completions"]), headers, b""
    return "POST", base + route, headers, body


def one(kind: str, rng: random.Random, base: str, report: Report, lock: threading.Lock) -> None:
    import httpx

    auth = {"Authorization": f"Bearer {KEY}"}
    messages = [{"role": "user", "content": rng.choice(["Tell me about the sea.", "Count to ten.", "你好！"])}]
    tokens = rng.randint(4, 24)
    chat = {"model": "m", "messages": messages, "max_tokens": tokens}
    started = time.perf_counter()
    status: int | str
    problem = None
    try:
        if kind == "malformed":
            method, url, headers, body = malformed(rng, base)
            answer = httpx.request(method, url, headers=headers, content=body, timeout=60)
            status = answer.status_code
            if not 400 <= status < 500:
                problem = f"{status} for a malformed request: {answer.text[:120]}"
            elif "error" not in answer.json():
                problem = f"{status} without an OpenAI error body"
        elif kind in ("chat_stream", "completion_stream", "disconnect"):
            route = "/completions" if kind == "completion_stream" else "/chat/completions"
            body = {**chat, "stream": True}
            if kind == "completion_stream":
                body = {"model": "m", "prompt": "Once upon a time", "max_tokens": tokens, "stream": True}
            if kind == "disconnect":
                body["max_tokens"] = 400
            with httpx.stream("POST", base + route, json=body, headers=auth, timeout=60) as answer:
                status = answer.status_code
                events = []
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if kind == "disconnect" and len(events) >= 2:
                            break  # the client goes away mid-stream
            ended_in_time = status == 200 and events and events[-1] == "[DONE]"
            # under load a stream may run out of time too: then its last event says so, in OpenAI's shape
            timed_out = status == 200 and events and '"code": "timeout"' in events[-1]
            if kind != "disconnect" and not ended_in_time and not timed_out:
                problem = f"{status}, stream ended with {events[-1:]!r}"
            if timed_out:
                status = "timed out"
            if kind != "disconnect" and not problem and not timed_out:
                with lock:
                    report.latencies.append(time.perf_counter() - started)
        else:
            route = "/completions" if kind == "completion" else "/chat/completions"
            body: dict[str, Any] = chat
            if kind == "completion":
                body = {"model": "m", "prompt": "Once upon a time", "max_tokens": tokens}
            elif kind == "tool_call":
                body = {**chat, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 48}
            elif kind == "json":
                body = {**chat, "response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
                body["max_tokens"] = 48
            elif kind == "timeout":
                body = {**chat, "max_tokens": 4000}
            answer = httpx.post(base + route, json=body, headers=auth, timeout=120)
            status = answer.status_code
            expected = (504,) if kind == "timeout" else (200, 504)  # under load a reply may run out of time
            if status not in expected:
                problem = f"{status} (expected {expected}): {answer.text[:160]}"
            elif status == 200:
                found = answer.json()
                with lock:
                    report.tokens += found["usage"]["completion_tokens"]
                    report.latencies.append(time.perf_counter() - started)
                choice = found["choices"][0]
                if (
                    kind == "tool_call"
                    and not choice["message"].get("tool_calls")
                    and choice["finish_reason"] != "length"
                ):
                    problem = f"no tool call, and not cut by max_tokens: {choice}"  # (random members may not close it)
    except Exception as error:  # a broken connection, a client timeout: always a problem
        status, problem = type(error).__name__, f"{type(error).__name__}: {error}"
    with lock:
        report.add(kind, status, problem)


def process_state() -> tuple[float, int]:
    """(RSS in MB, threads) of this process now (ru_maxrss is the peak: the current RSS is read
    from /proc where there is one)."""
    try:
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return rss, threading.active_count()


def soak(base: str, requests: int, clients: int, seed: int) -> Report:
    """Send the seeded mix to `base` (".../v1") from `clients` threads; the `Report`."""
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=requests)
    seeds = [rng.randrange(2**32) for _ in kinds]
    report, lock = Report(), threading.Lock()
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda ks: one(ks[0], random.Random(ks[1]), base, report, lock), zip(kinds, seeds, strict=True)))
    report.seconds = time.perf_counter() - started
    report.state_after = process_state()
    return report


def serve_settings(timeout: float) -> Any:
    from ensemble_core.serving.app import ServeSettings

    return ServeSettings(
        model_id="m", api_key=KEY, max_batch=8, max_queue=256, request_timeout=timeout, max_tokens=4096
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--method", default="gac")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0, help="the server's request timeout (seconds)")
    args = parser.parse_args()

    from ensemble_core import Ensemble
    from ensemble_core.serving.app import create_app
    from ensemble_core.serving.background import serving_in_thread

    with Ensemble(tiny_members(), method=args.method) as ensemble:
        app = create_app(ensemble, serve_settings(args.timeout))
        with serving_in_thread(app) as base:
            for kind in ("chat", "json", "tool_call"):  # warm: first-call tables, the grammar's tokenizer
                one(kind, random.Random(0), base, Report(), threading.Lock())
            states = [process_state()]
            parts = [soak(base, args.requests // 4, args.clients, args.seed + part) for part in range(4)]
            time.sleep(1.0)  # let disconnected and timed-out generations leave the batch
            states.append(process_state())
            report = Report()
            for part in parts:
                report.answers.update(part.answers)
                report.problems += part.problems
                report.latencies += part.latencies
                report.tokens += part.tokens
                report.seconds += part.seconds
                states.insert(-1, part.state_after)
    print(f"{args.requests} requests, {args.clients} clients, {args.method}, {report.seconds:.0f} s")
    print("| kind | answers |")
    print("|---|---|")
    for kind in KINDS:
        found = {status: n for (k, status), n in sorted(report.answers.items(), key=str) if k == kind}
        print(f"| {kind} | {', '.join(f'{status}: {n}' for status, n in found.items())} |")
    latencies = sorted(report.latencies)
    p50, p95 = statistics.median(latencies), latencies[int(0.95 * (len(latencies) - 1))]
    print(f"generating requests completed: {len(latencies)}; latency p50 {p50:.2f} s, p95 {p95:.2f} s")
    print(f"tokens/s (whole replies' completion tokens over the run): {report.tokens / report.seconds:.1f}")
    print("RSS MB / threads at the start, after each quarter, and at the end:")
    print("  " + " -> ".join(f"{rss:.0f} / {threads}" for rss, threads in states))
    print(f"problems: {len(report.problems)}")
    for problem in report.problems[:20]:
        print("   ", problem)


if __name__ == "__main__":
    main()
