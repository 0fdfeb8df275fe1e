"""Continuous batching: requests join a running batch at step boundaries and leave when done.

Three levels. A member's session: a request admitted into a session whose cache already
holds other requests' columns gets exactly the logits of an uncached forward, and so do the
requests already there (real tiny HF models, every attention layout we support). The decode
loop: every method, requests admitted while others run (and after others ended) each get
exactly the text they get alone. The `Batcher`: many threads at once, a full queue, a
deadline, a cancelled request, a closed batcher.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_requests import METHODS, ending_member

from ensemble_core import Ensemble
from ensemble_core.batching import Batcher, QueueFull, RequestTimeout
from ensemble_core.errors import ClosedError, EnsembleError
from ensemble_core.members.contract import Boundary, RequestId
from ensemble_core.results import StreamChunk
from reference import ATOL, uncached_next_logits

PROMPTS = ["The", "A much longer prompt about rivers and", "Hello there, said", "1 2 3 4"]


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_a_request_admitted_into_a_running_session_gets_exact_logits(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    first, second, third = RequestId(1), RequestId(2), RequestId(3)
    prompts = {first: member.render("The"), second: member.render("A longer prompt, with more tokens in it")}
    session = member.start({first: prompts[first]}, Boundary.RETOKENIZE)
    texts = {first: b"", second: b""}

    def check(requests: list[RequestId]) -> None:
        found = session.next(requests)
        for request, distribution in zip(requests, found, strict=True):
            ids = prompts[request].ids + session.token_ids(request)
            expected = torch.softmax(uncached_next_logits(member.model, ids).float(), dim=-1)
            torch.testing.assert_close(distribution.dense, expected, atol=ATOL, rtol=0)
            assert member.table.spell(session.token_ids(request)) == texts[request]

    def commit(request: RequestId, data: bytes) -> None:
        session.commit(request, data)
        texts[request] += data

    for chunk in (b" river", b" runs"):
        check([first])
        commit(first, chunk)
    session.admit({second: prompts[second]})  # joins a cache that holds the first's columns
    for chunk_a, chunk_b in ((b" to", b" and"), (b" the", b" then"), (b" sea", b" more")):
        check([first, second])
        commit(first, chunk_a)
        commit(second, chunk_b)
    check([first, second])
    session.drop([first, second])  # nothing left: the next request starts on an empty cache
    prompts[third] = member.render("Hello")
    texts[third] = b""
    session.admit({third: prompts[third]})
    check([third])
    session.commit(third, b" world")
    texts[third] += b" world"
    check([third])


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_gives_each_admitted_request_its_text_alone(name: str, tiny_member) -> None:
    members = [ending_member(tiny_member, "tiny-llama", "a"), ending_member(tiny_member, "tiny-qwen2", "b")]
    ensemble = Ensemble(members, method=METHODS[name])
    limits = [20, 12, 16, 20]
    prepared = [ensemble.prepare(p, max_new_tokens=n) for p, n in zip(PROMPTS, limits, strict=True)]
    loop = ensemble.open_loop(prepared[0].settings)
    results: dict[RequestId, object] = {}

    def step() -> None:
        for request, chunk in loop.step():
            if chunk.result is not None:
                results[request] = chunk.result

    handles = ensemble.admit(loop, prepared[:1])
    step()
    step()
    handles += ensemble.admit(loop, prepared[1:3])  # join a batch two steps in
    while handles[0] not in results:
        step()
    handles += ensemble.admit(loop, prepared[3:])  # join after the first one left
    while loop.requests:
        step()
    for prompt, limit, handle in zip(PROMPTS, limits, handles, strict=True):
        alone = ensemble.generate(prompt, max_new_tokens=limit)
        assert results[handle].text == alone.text, prompt
        assert results[handle].token_ids == alone.token_ids
        assert results[handle].stats.method_stats == alone.stats.method_stats


def test_a_request_with_other_sampling_settings_cannot_join_a_batch(tiny_member) -> None:
    ensemble = Ensemble([ending_member(tiny_member, "tiny-llama", "a")], method="single")
    loop = ensemble.open_loop(ensemble.prepare("x").settings)
    with pytest.raises(ValueError, match="same temperature, top_p and stop"):
        ensemble.admit(loop, [ensemble.prepare("x", temperature=0.7)])


class Collector:
    """A ticket's deliveries, and an event once the last one came."""

    def __init__(self) -> None:
        self.items: list[StreamChunk | BaseException] = []
        self.done = threading.Event()

    def __call__(self, item: StreamChunk | BaseException) -> None:
        self.items.append(item)
        if isinstance(item, BaseException) or item.result is not None:
            self.done.set()

    def result(self):
        assert self.done.wait(60)
        last = self.items[-1]
        if isinstance(last, BaseException):
            raise last
        assert "".join(c.text for c in self.items) == last.result.text  # streamed pieces add up
        return last.result


@pytest.fixture
def pair(tiny_member) -> Ensemble:
    members = [ending_member(tiny_member, "tiny-llama", "a"), ending_member(tiny_member, "tiny-qwen2", "b")]
    return Ensemble(members, method="gac")


def test_requests_from_many_threads_are_batched_and_each_gets_its_text_alone(pair: Ensemble) -> None:
    batcher = Batcher(pair, max_batch=8)
    settings = [{"max_new_tokens": 16}, {"max_new_tokens": 12}, {"max_new_tokens": 16, "temperature": 0.8, "seed": 3}]
    jobs = [(prompt, options) for prompt in PROMPTS for options in settings]
    collectors = [Collector() for _ in jobs]

    def client(index: int) -> None:
        time.sleep(0.01 * (index % 4))  # arrive while others already run
        prompt, options = jobs[index]
        batcher.submit(pair.prepare(prompt, **options), collectors[index])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = [c.result() for c in collectors]
    batcher.close()
    for (prompt, options), result in zip(jobs, results, strict=True):
        assert result.text == pair.generate(prompt, **options).text, (prompt, options)
    assert batcher.steps < sum(r.stats.steps for r in results)  # steps were shared


def test_a_full_queue_refuses_and_a_deadline_stops_a_request(pair: Ensemble) -> None:
    batcher = Batcher(pair, max_batch=1, max_queue=2)
    first = Collector()
    with pair.hold():  # the scheduler takes the first request, then waits for the ensemble
        batcher.submit(pair.prepare("The", max_new_tokens=4), first)
        while batcher.load[1]:
            time.sleep(0.001)
        waiting = [Collector(), Collector(), Collector()]
        tickets = [batcher.submit(pair.prepare("The", max_new_tokens=4), c) for c in waiting[:2]]
        with pytest.raises(QueueFull, match="max_queue=2"):
            batcher.submit(pair.prepare("The", max_new_tokens=4), Collector())
        tickets[0].cancel()  # a cancelled ticket no longer takes a place in the queue
        batcher.submit(pair.prepare("The", max_new_tokens=4), waiting[2])
    waiting = waiting[1:]
    for collector in [first, *waiting]:
        assert collector.result().text == pair.generate("The", max_new_tokens=4).text
    late, queued_late = Collector(), Collector()
    with pair.hold():  # one deadline passes while generating, one while still queued
        batcher.submit(pair.prepare("The", max_new_tokens=200), late, timeout=0.0)
        while batcher.load[1]:
            time.sleep(0.001)
        batcher.submit(pair.prepare("The", max_new_tokens=200), queued_late, timeout=0.0)
    for collector in (late, queued_late):
        with pytest.raises(RequestTimeout, match="timeout"):
            collector.result()
    batcher.close()


def test_a_cancelled_request_gets_nothing_more_and_frees_its_place(pair: Ensemble) -> None:
    batcher = Batcher(pair, max_batch=1)
    stopped = threading.Event()
    seen: list[StreamChunk | BaseException] = []

    def deliver(item: StreamChunk | BaseException) -> None:
        seen.append(item)
        ticket.cancel()
        stopped.set()

    ticket = batcher.submit(pair.prepare("1 2 3 4", max_new_tokens=40, stop=["never"]), deliver)
    assert stopped.wait(60)
    after = Collector()
    batcher.submit(pair.prepare("The", max_new_tokens=4), after)  # max_batch=1: needs the freed place
    assert after.result().text == pair.generate("The", max_new_tokens=4).text
    assert len(seen) == 1
    batcher.close()


def test_closing_ends_unfinished_requests_with_an_error(pair: Ensemble) -> None:
    batcher = Batcher(pair, max_batch=1)
    collectors = [Collector() for _ in range(3)]
    with pair.hold():
        for collector in collectors:
            batcher.submit(pair.prepare("The", max_new_tokens=30), collector)
        closing = threading.Thread(target=batcher.close)
        closing.start()
    closing.join(60)
    for collector in collectors:
        if collector.done.is_set() and not isinstance(collector.items[-1], BaseException):
            continue  # finished before the close was seen
        with pytest.raises(EnsembleError, match="closed"):
            collector.result()
    with pytest.raises(EnsembleError, match="closed"):
        batcher.submit(pair.prepare("The"), Collector())
    pair.close()
    with pytest.raises(ClosedError):
        pair.prepare("The")
