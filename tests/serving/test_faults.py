"""A member that fails mid-batch: only that batch's requests fail (503 naming the member), the
server stays up and says so on /health, and later requests succeed (a member whose host died
is restarted by the server itself). Members are tiny random models on the real tokenizers,
one of which raises from its forward pass on demand, as a GPU out of memory or a driver error
would."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from openai import APIStatusError, OpenAI
from test_requests import ending_member

from ensemble_core import Ensemble, MemberFailedError
from ensemble_core.serving.app import ServeSettings, create_app
from ensemble_core.serving.background import serving_in_thread
from ensemble_core.testing import FakeMember


class Fragile(FakeMember):
    """A FakeMember that raises from its forward while `broken` is set; with `restartable`, it
    also plays a member whose host died (as a Ray actor's): `alive()` is False until `restart()`."""

    def __init__(self, member: FakeMember, restartable: bool = False):
        self.broken: Exception | None = None
        self.host_gone = False
        self.restartable = restartable
        self.restarted = 0
        inner = member._logits

        def logits(ids: list[int]) -> torch.Tensor:
            if self.broken is not None:
                raise self.broken
            return inner(ids)

        super().__init__(
            member.tokenizer, logits, member.name, eos_token_ids=member.eos_token_ids, width=member.logits_width
        )

    def alive(self) -> bool:
        return not self.host_gone

    def restart(self) -> None:
        self.host_gone, self.broken = False, None
        self.restarted += 1


def _app(tiny_member, restartable: bool = False):
    fragile = Fragile(ending_member(tiny_member, "tiny-qwen2", "fragile"), restartable)
    steady = ending_member(tiny_member, "tiny-llama", "steady")
    ensemble = Ensemble([steady, fragile], method="gac")
    return fragile, create_app(ensemble, ServeSettings(model_id="pair", max_tokens=400))


def _health(base_url: str) -> dict:
    return httpx.get(base_url.removesuffix("/v1") + "/health").json()


def _fail_three(base_url: str, app, fragile: Fragile, error: Exception) -> list[APIStatusError]:
    """Three requests generating together; the member fails mid-batch; each request's error."""
    with ThreadPoolExecutor(3) as pool:
        asked = [pool.submit(_ask, base_url, f"Tell me a long story number {n}.") for n in range(3)]
        _break_when_generating(app, fragile, error)
        errors = []
        for future in asked:
            with pytest.raises(APIStatusError) as caught:
                future.result(timeout=120)
            errors.append(caught.value)
    return errors


def _ask(base_url: str, content: str, tokens: int = 300):
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    return client.chat.completions.create(
        model="pair", messages=[{"role": "user", "content": content}], max_tokens=tokens, temperature=0
    )


def _break_when_generating(app, fragile: Fragile, error: Exception) -> None:
    batcher = app.state.batcher
    deadline = time.monotonic() + 60
    while batcher.load[0] < 3 and time.monotonic() < deadline:  # all three generating in one batch
        time.sleep(0.005)
    start = batcher.steps
    while batcher.steps < start + 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    fragile.broken = error


def test_a_member_failing_mid_batch_fails_only_that_batch_and_the_server_goes_on(tiny_member) -> None:
    fragile, app = _app(tiny_member)
    with serving_in_thread(app) as base_url:
        fault = RuntimeError("CUDA error: an illegal memory access was encountered")
        for error in _fail_three(base_url, app, fragile, fault):
            assert error.status_code == 503
            assert "'fragile'" in error.message and "illegal memory access" in error.message
            assert error.body["code"] == "member_failed"
        health = _health(base_url)
        assert health["status"] == "degraded"
        states = {m["name"]: m for m in health["members"]}
        assert states["steady"]["state"] == "ok"
        assert states["fragile"]["state"] == "failed" and "illegal memory access" in states["fragile"]["error"]

        fragile.broken = None  # the fault passed (memory freed, the driver recovered)
        assert _ask(base_url, "Where is the sea?", tokens=8).choices[0].message.content
        health = _health(base_url)
        assert (health["status"], [m["state"] for m in health["members"]]) == ("ok", ["ok", "ok"])
        assert app.state.batcher.load == (0, 0)  # no row left behind by the failed batch


def test_out_of_memory_is_the_members_failure_with_what_to_do(tiny_member) -> None:
    """Without a server too: the caller gets `MemberFailedError` naming the member and the fix,
    not torch's error from deep inside a forward; the ensemble works on once memory is back."""
    fragile, app = _app(tiny_member)
    ensemble = app.state.batcher.ensemble
    fragile.broken = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(MemberFailedError, match=r"'fragile' failed .*ran out of memory.*--max-batch") as caught:
        ensemble.generate("Once upon a time", max_new_tokens=4)
    assert caught.value.member == "fragile"
    fragile.broken = None
    assert ensemble.generate("Once upon a time", max_new_tokens=4).usage.completion_tokens >= 1


def test_a_member_whose_host_died_is_restarted_and_later_requests_succeed(tiny_member) -> None:
    fragile, app = _app(tiny_member, restartable=True)
    with serving_in_thread(app) as base_url:
        fragile.host_gone = True  # as a Ray actor killed mid-batch: its calls fail, alive() says so
        errors = _fail_three(base_url, app, fragile, RuntimeError("The actor died unexpectedly"))
        assert [e.status_code for e in errors] == [503, 503, 503]
        assert fragile.restarted == 1  # once for the batch, by the server, at once
        assert _health(base_url)["members"][1]["restarted"] is True
        for n in range(3):
            assert _ask(base_url, f"Question {n}?", tokens=8).choices[0].message.content
        assert _health(base_url)["status"] == "ok"
