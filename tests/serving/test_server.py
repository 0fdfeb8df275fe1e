"""`ensemble-llm serve` against REAL clients: the `openai` package and LangChain's `ChatOpenAI`.

Each test starts the app on a free local port (`serving_in_thread`). Two ensembles: a GaC
pair of tiny float32 random models on the Qwen and SmolLM2 tokenizers (greedy results must
equal `Ensemble.generate` for the same request, also when many clients send at once), and a
scripted member on Qwen's tokenizer that writes a known answer, a tool call or a JSON object,
so what the clients parse out of the wire format can be checked exactly.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI
from openai import APIStatusError, OpenAI
from test_requests import ending_member

from ensemble_core import Ensemble
from ensemble_core.serving.app import ServeSettings, create_app
from ensemble_core.serving.background import serving_in_thread
from ensemble_core.testing import FakeMember

KEY = "test-key"
ANSWER = "The capital of France is Paris."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OBJECT = '{"city": "Paris", "country": "France"}'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
}


def typist(tokenizer, name: str) -> FakeMember:
    """A member that writes `CALL` when offered the tool (until its result is in), `OBJECT`
    when asked for JSON, else `ANSWER`: each step its longest token that continues the target (then its end token)."""
    opening = "\nassistant\n"  # the template's control tokens (<|im_start|>) spell no text
    plain: set[bytes] = set()

    def script(text: str) -> dict[str, float]:
        prompt, _, reply = text.rpartition(opening)
        offered = "get_weather" in prompt and "Sunny" not in prompt  # the tool, and no result yet
        target = CALL if offered else OBJECT if "JSON" in prompt else ANSWER
        if not target.startswith(reply) or reply == target:
            return {"<eos>": 1.0}
        rest = target[len(reply) :]
        longest = next(rest[:n] for n in range(min(len(rest), 16), 0, -1) if rest[:n].encode() in plain)
        return {longest: 1.0}

    member = FakeMember.scripted(tokenizer, name, script, context_window=512)
    added = set(tokenizer.added_tokens_decoder)  # "<tool_call>" is one added token: write it as text
    plain |= {text for text, ids in member.table.ids_by_bytes.items() if set(ids) - added}
    return member


@pytest.fixture(scope="module")
def pair(request) -> Ensemble:
    tiny_member = request.getfixturevalue("tiny_member")
    members = [ending_member(tiny_member, "tiny-llama", "a"), ending_member(tiny_member, "tiny-qwen2", "b")]
    return Ensemble(members, method="gac")


@pytest.fixture(scope="module")
def pair_server(pair: Ensemble):
    app = create_app(pair, ServeSettings(model_id="pair", api_key=KEY, max_tokens=64))
    with serving_in_thread(app) as base_url:
        yield base_url, app


@pytest.fixture(scope="module")
def writer_server(request):
    load_tokenizer = request.getfixturevalue("load_tokenizer")
    ensemble = Ensemble([typist(load_tokenizer("qwen2.5-coder-0.5b-instruct"), "typist")], method="single")
    with serving_in_thread(create_app(ensemble, ServeSettings(model_id="typist"))) as base_url:
        yield base_url, ensemble


def client(base_url: str, key: str = KEY) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=key, max_retries=0)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the sea?"}]


def test_chat_completion_equals_generate_and_carries_the_report(pair_server, pair: Ensemble) -> None:
    base_url, _ = pair_server
    completion = client(base_url).chat.completions.create(model="pair", messages=MESSAGES, max_tokens=20)
    expected = pair.generate(MESSAGES, max_new_tokens=20)
    assert completion.choices[0].message.content == expected.text
    assert completion.choices[0].finish_reason == expected.api_finish_reason(False)
    assert completion.usage.completion_tokens == expected.usage.completion_tokens
    assert completion.usage.prompt_tokens == expected.usage.prompt_tokens
    report = completion.model_extra["ensemble"]
    assert report["method"] == "gac"
    assert set(report["member_seconds"]) == {"a", "b"}
    assert 0.0 <= report["share_ensembled"] <= 1.0


def test_text_parts_are_joined_as_the_library_joins_them(pair_server, pair: Ensemble) -> None:
    """One message as a list of text parts is the same prompt through the server as through
    `Ensemble.generate` (and so through both adapters)."""
    base_url, _ = pair_server
    parts = [{"role": "user", "content": [{"type": "text", "text": "Where is"}, {"type": "text", "text": "the sea?"}]}]
    completion = client(base_url).chat.completions.create(model="pair", messages=parts, max_tokens=12)
    assert completion.choices[0].message.content == pair.generate(parts, max_new_tokens=12).text


def test_streamed_chat_adds_up_to_the_same_text_with_usage_last(pair_server, pair: Ensemble) -> None:
    base_url, _ = pair_server
    stream = client(base_url).chat.completions.create(
        model="pair",
        messages=MESSAGES,
        max_completion_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = pair.generate(MESSAGES, max_new_tokens=20)
    assert text == expected.text
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].model_extra["ensemble"]["method"] == "gac"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected.usage.completion_tokens


def test_concurrent_clients_each_get_their_text_alone_in_shared_steps(pair_server, pair: Ensemble) -> None:
    base_url, app = pair_server
    prompts = [f"Tell me about {topic}." for topic in ("rivers", "the sea", "mountains", "a long walk in the rain")]
    jobs = [(p, n) for p in prompts for n in (12, 20)]
    found: dict[int, str] = {}
    steps_before = app.state.batcher.steps

    def ask(index: int) -> None:
        prompt, limit = jobs[index]
        reply = client(base_url).chat.completions.create(
            model="pair", messages=[{"role": "user", "content": prompt}], max_tokens=limit, temperature=0
        )
        found[index] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    steps = app.state.batcher.steps - steps_before
    alone = [pair.generate([{"role": "user", "content": p}], max_new_tokens=n) for p, n in jobs]
    assert [found[i] for i in range(len(jobs))] == [r.text for r in alone]
    assert steps < sum(r.stats.steps for r in alone)  # requests shared forwards


def test_completions_endpoint_streamed_and_whole(pair_server, pair: Ensemble) -> None:
    base_url, _ = pair_server
    openai = client(base_url)
    whole = openai.completions.create(model="pair", prompt="Once upon a time", max_tokens=16)
    chunks = openai.completions.create(model="pair", prompt="Once upon a time", max_tokens=16, stream=True)
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    expected = pair.generate("Once upon a time", max_new_tokens=16).text
    assert whole.choices[0].text == expected == streamed
    assert whole.object == "text_completion"


def test_models_health_and_errors_in_openai_shape(pair_server) -> None:
    base_url, _ = pair_server
    openai = client(base_url)
    assert [m.id for m in openai.models.list().data] == ["pair"]
    root = base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health").json()["status"] == "ok"  # no key needed
    cases = [
        (client(base_url, "wrong"), {"messages": MESSAGES, "model": "pair"}, 401, "invalid_api_key"),
        (openai, {"messages": MESSAGES, "model": "gpt-4o"}, 404, "model_not_found"),
        (openai, {"messages": MESSAGES, "model": "pair", "n": 2}, 400, None),
        (openai, {"messages": MESSAGES, "model": "pair", "max_tokens": 65}, 400, None),  # above the cap
        (openai, {"messages": MESSAGES, "model": "pair", "temperature": -1}, 400, None),
        (openai, {"messages": [{"role": "user"}], "model": "pair"}, 400, None),
    ]
    for api, arguments, status, code in cases:
        with pytest.raises(APIStatusError) as caught:
            api.chat.completions.create(**arguments)
        assert caught.value.status_code == status, arguments
        body = caught.value.body
        assert body["message"] and body["type"], body  # the client unwraps {"error": {...}}
        assert body["code"] == code
    flagged = httpx.post(  # the string "false" is truthy: read as a flag it would stream
        f"{base_url}/chat/completions",
        json={"messages": MESSAGES, "model": "pair", "stream": "false", "max_tokens": 8},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert flagged.status_code == 400 and "`stream` must be true or false" in flagged.json()["error"]["message"]
    huge = httpx.post(
        f"{base_url}/chat/completions",
        content=b"x" * (2 << 20),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    assert huge.status_code == 413 and "at most" in huge.json()["error"]["message"]
    for depth in (65, 100_000):  # past the limit, and past what Python's parser can nest
        deep = httpx.post(
            f"{base_url}/chat/completions",
            content=b'{"messages": ' + b"[" * depth + b"]" * depth + b"}",
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
        assert deep.status_code == 400 and "deeper than 64 levels" in deep.json()["error"]["message"]


def test_replies_carry_a_request_id_and_metrics_count_them(pair_server) -> None:
    base_url, _ = pair_server
    root = base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"messages": MESSAGES, "model": "pair", "max_tokens": 4}
    mine = httpx.post(
        f"{base_url}/chat/completions", json=body, headers={**headers, "X-Request-Id": "trace-42"}, timeout=120
    )
    assert mine.status_code == 200 and mine.headers["x-request-id"] == "trace-42"
    made = httpx.post(
        f"{base_url}/chat/completions", json=body, headers={**headers, "X-Request-Id": "bad id"}, timeout=120
    )
    assert made.headers["x-request-id"].startswith("req_")  # an id that is not sane is replaced
    refused = httpx.post(f"{base_url}/chat/completions", json={**body, "n": 2}, headers=headers)
    assert refused.status_code == 400 and refused.headers["x-request-id"].startswith("req_")
    assert httpx.get(f"{root}/metrics").status_code == 401  # only /health is open when a key is set
    exposition = httpx.get(f"{root}/metrics", headers=headers).text
    counts = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in exposition.splitlines() if not line.startswith("#")
    }
    assert counts['ensemble_llm_requests_total{route="/v1/chat/completions",status="200"}'] >= 2
    assert counts['ensemble_llm_requests_total{route="/v1/chat/completions",status="400"}'] >= 1
    assert counts["ensemble_llm_completion_tokens_total"] >= 2  # one or more per reply
    assert counts['ensemble_llm_request_seconds_count{route="/v1/chat/completions"}'] >= 3
    assert counts["ensemble_llm_waiting_requests"] == 0


def test_a_member_without_a_chat_template_refuses_chat_with_400_and_still_completes(tiny_member) -> None:
    """Gemma-3-270M (a base model) has no chat template: chat requests are the client's to fix
    (a 400 that names the member and the way out, never a retryable 5xx); raw completions work."""
    base = Ensemble([tiny_member("tiny-gemma3")], method="single")
    with serving_in_thread(create_app(base, ServeSettings(model_id="base", max_tokens=8))) as base_url:
        openai = client(base_url)
        with pytest.raises(APIStatusError) as caught:
            openai.chat.completions.create(model="base", messages=MESSAGES, max_tokens=4)
        assert caught.value.status_code == 400
        assert "has no chat template" in caught.value.body["message"]
        assert caught.value.body["type"] == "invalid_request_error"
        assert openai.completions.create(model="base", prompt="Once upon", max_tokens=4).choices[0].text


def test_a_full_queue_answers_429(pair: Ensemble) -> None:
    app = create_app(pair, ServeSettings(model_id="pair", max_batch=1, max_queue=1))
    batcher = app.state.batcher
    with serving_in_thread(app) as base_url:
        with pair.hold():  # the first request is taken and waits for the ensemble; one more waits
            batcher.submit(pair.prepare("The", max_new_tokens=2), lambda _: None)
            while batcher.load[1]:
                time.sleep(0.001)
            batcher.submit(pair.prepare("The", max_new_tokens=2), lambda _: None)
            with pytest.raises(APIStatusError) as caught:
                client(base_url).chat.completions.create(model="pair", messages=MESSAGES)
        assert caught.value.status_code == 429 and caught.value.body["code"] == "queue_full"


@pytest.fixture(scope="module")
def endless_server(request):
    """A member that never ends its reply and takes 20 ms a step: 64 tokens take >= 1.3 s."""
    load_tokenizer = request.getfixturevalue("load_tokenizer")

    def script(_: str) -> dict[str, float]:
        time.sleep(0.02)
        return {" la": 1.0}

    member = FakeMember.scripted(load_tokenizer("qwen2.5-coder-0.5b-instruct"), "la", script)
    app = create_app(Ensemble([member], method="single"), ServeSettings(model_id="la", max_tokens=64))
    with serving_in_thread(app) as base_url:
        yield base_url, app.state.batcher


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_stops_its_generation(endless_server, stream: bool) -> None:
    base_url, batcher = endless_server
    body = {"model": "la", "messages": MESSAGES, "max_tokens": 64, "stream": stream}
    before = batcher.steps
    if stream:
        with httpx.stream("POST", f"{base_url}/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and "la" in line:
                    break  # the first text came: hang up
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base_url}/chat/completions", json=body, timeout=0.3)
    deadline = time.monotonic() + 30
    while batcher.load != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher.load == (0, 0)
    assert batcher.steps - before < 50  # stopped well before its 64 tokens


def test_a_request_past_its_timeout_gets_504(pair: Ensemble) -> None:
    app = create_app(pair, ServeSettings(model_id="pair", request_timeout=0.0))
    with serving_in_thread(app) as base_url:
        with pytest.raises(APIStatusError) as caught:
            client(base_url).chat.completions.create(model="pair", messages=MESSAGES)
        assert caught.value.status_code == 504 and caught.value.body["code"] == "timeout"
        assert caught.value.response.headers["x-should-retry"] == "false"  # its time is spent: no retries
        missing = httpx.get(f"{base_url}/nothing-here")
        assert missing.status_code == 404 and missing.json()["error"]["type"]


def test_tool_calls_whole_and_streamed(writer_server) -> None:
    base_url, _ = writer_server
    openai = client(base_url, "none")
    asked = {"model": "typist", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    completion = openai.chat.completions.create(**asked)
    [call] = completion.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.id.startswith("call_")
    deltas = [c.choices[0].delta for c in openai.chat.completions.create(**asked, stream=True) if c.choices]
    streamed = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert [(s.index, s.function.name, json.loads(s.function.arguments)) for s in streamed] == [
        (0, "get_weather", {"city": "Paris"})
    ]
    forced = openai.chat.completions.create(
        **asked, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"
    history = [
        *asked["messages"],
        completion.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    follow_up = openai.chat.completions.create(model="typist", messages=history)
    assert follow_up.choices[0].message.content == ANSWER  # the tool's result went back in as a turn


def test_json_schema_reply(writer_server) -> None:
    base_url, _ = writer_server
    completion = client(base_url, "none").chat.completions.create(
        model="typist",
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}},
    )
    assert json.loads(completion.choices[0].message.content) == json.loads(OBJECT)


def test_chat_openai_runs_the_example_chain_with_the_same_text(writer_server) -> None:
    base_url, ensemble = writer_server
    llm = ChatOpenAI(base_url=base_url, api_key="none", model="typist", max_tokens=32, temperature=0, max_retries=0)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a concise Python tutor."), ("human", "Explain {topic} in two sentences.")]
    )
    chain = prompt | llm | StrOutputParser()
    messages = [
        {"role": "system", "content": "You are a concise Python tutor."},
        {"role": "user", "content": "Explain generators in two sentences."},
    ]
    expected = ensemble.generate(messages, max_new_tokens=32, temperature=0).text
    assert chain.invoke({"topic": "generators"}) == expected == ANSWER
    assert "".join(chain.stream({"topic": "generators"})) == expected
    message = (prompt | llm).invoke({"topic": "generators"})
    assert message.usage_metadata["output_tokens"] > 0


def test_context_window_is_checked_before_queueing(writer_server) -> None:
    base_url, _ = writer_server
    with pytest.raises(APIStatusError) as caught:
        client(base_url, "none").chat.completions.create(
            model="typist", messages=[{"role": "user", "content": "word " * 600}], max_tokens=16
        )
    assert caught.value.status_code == 400 and caught.value.body["code"] == "context_length_exceeded"
