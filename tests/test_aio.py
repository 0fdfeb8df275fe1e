"""asyncio access: same text as the sync stream, a free event loop, cancellation, concurrency.

Mechanics of the async wrappers, whatever the model: a tiny random-weight model on SmolLM2's
real tokenizer that never ends a text (`reference.endless`), so every generation runs as long
as it is asked to, in milliseconds."""

from __future__ import annotations

import asyncio

import pytest

from ensemble_core import Ensemble
from reference import endless

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def ensemble(tiny_member) -> Ensemble:
    return Ensemble([endless(tiny_member("tiny-llama"))], method="single")


async def test_astream_gives_the_chunks_of_stream(ensemble: Ensemble) -> None:
    expected = [(c.text, c.finish_reason) for c in ensemble.stream(PROMPT, max_new_tokens=24)]
    got = [(c.text, c.finish_reason) async for c in ensemble.astream(PROMPT, max_new_tokens=24)]
    assert got == expected
    assert (await ensemble.agenerate(PROMPT, max_new_tokens=24)).text == "".join(t for t, _ in expected)


async def test_the_event_loop_keeps_running_during_generation(ensemble: Ensemble) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    steps_before = ticks
    result = await ensemble.agenerate(PROMPT, max_new_tokens=64)
    done.set()
    await task
    # A blocked loop would tick at most once; a free one ticks while the worker thread decodes.
    assert result.stats.steps == 64
    assert ticks - steps_before > 5


async def test_cancelling_a_stream_stops_it_and_frees_the_ensemble(ensemble: Ensemble) -> None:
    reference = ensemble.generate(PROMPT, max_new_tokens=20).text
    stream = ensemble.astream(PROMPT, max_new_tokens=480)  # near the tiny model's 512-token window
    first = await anext(stream)
    await stream.aclose()
    # the worker stops after its current step and releases the ensemble's lock
    acquired = await asyncio.to_thread(ensemble._lock.acquire, True, 30)
    assert acquired
    ensemble._lock.release()
    assert first.result is None
    assert ensemble.generate(PROMPT, max_new_tokens=20).text == reference

    task = asyncio.create_task(ensemble.agenerate(PROMPT, max_new_tokens=480))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await ensemble.agenerate(PROMPT, max_new_tokens=20)).text == reference


async def test_concurrent_calls_with_different_stops_equal_sequential_calls(ensemble: Ensemble) -> None:
    full = ensemble.generate(PROMPT, max_new_tokens=40).text
    stops = [full[i : i + 3] for i in range(4, 36, 4)]
    assert len(stops) == 8
    sequential = [ensemble.generate(PROMPT, max_new_tokens=40, stop=[s]).text for s in stops]
    concurrent = await asyncio.gather(*(ensemble.agenerate(PROMPT, max_new_tokens=40, stop=[s]) for s in stops))
    assert [r.text for r in concurrent] == sequential
    assert len(set(sequential)) > 1  # the stops really cut at different places


async def test_bad_input_fails_at_the_call_as_stream_does(ensemble: Ensemble) -> None:
    from ensemble_core import ConfigError

    with pytest.raises(ConfigError, match="max_new_tokens"):
        ensemble.astream(PROMPT, max_new_tokens=0)  # raises here, not at the first iteration
    with pytest.raises(ConfigError, match="role 'wizard'"):
        ensemble.astream([{"role": "wizard", "content": "hi"}])
    with pytest.raises(ConfigError, match="max_new_tokens"):
        await ensemble.agenerate(PROMPT, max_new_tokens=0)
