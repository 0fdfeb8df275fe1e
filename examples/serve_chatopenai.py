"""Serve a two-model ensemble with OpenAI's API, then call it with LangChain's `ChatOpenAI`.

Starts `ensemble-llm serve` (Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE, as in
`langchain_chain.py`) on a free local port with an API key, runs the same chain through
`ChatOpenAI(base_url=...)`, reads the ensemble's report with the `openai` client, and stops
the server. Any OpenAI client (curl, the `openai` package, LlamaIndex's `OpenAILike`, ...)
can call it the same way.

Run: `python examples/serve_chatopenai.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI
from openai import OpenAI

KEY = "example-key"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(root: str, server: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode}")
        try:
            if httpx.get(f"{root}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet: the models are loading
        time.sleep(0.5)
    raise SystemExit("the server did not come up in time")


def main() -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "ensemble_core.cli", "serve",
        "-m", "qwen2.5-coder-0.5b-instruct", "-m", "smollm2-135m-instruct",
        "--method", "safe", "--method-params", '{"drafter": "qwen"}',
        "--port", str(port), "--api-key", KEY, "--model-id", "qwen-smol-safe",
    ]  # fmt: skip
    server = subprocess.Popen(command)
    try:
        root = f"http://127.0.0.1:{port}"
        wait_until_up(root, server)
        llm = ChatOpenAI(base_url=f"{root}/v1", api_key=KEY, model="qwen-smol-safe", max_tokens=32, temperature=0)
        prompt = ChatPromptTemplate.from_messages(
            [("system", "You are a concise Python tutor."), ("human", "Explain {topic} in two sentences.")]
        )
        chain = prompt | llm | StrOutputParser()
        print("=== streamed through ChatOpenAI")
        for piece in chain.stream({"topic": "list comprehensions"}):
            print(piece, end="", flush=True)
        print()

        completion = OpenAI(base_url=f"{root}/v1", api_key=KEY).chat.completions.create(
            model="qwen-smol-safe",
            messages=[{"role": "user", "content": "Explain generators in two sentences."}],
            max_tokens=32,
        )
        report = completion.model_extra["ensemble"]
        print("=== the openai client, with the ensemble's report")
        print(completion.choices[0].message.content)
        print(
            f"usage: {completion.usage.prompt_tokens} prompt + {completion.usage.completion_tokens} completion tokens"
        )
        print(f"share of tokens decided by the whole ensemble: {report['share_ensembled']:.0%}")
        print(f"forward seconds per member: {report['member_seconds']}")
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
