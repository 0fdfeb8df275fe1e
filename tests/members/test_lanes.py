"""Lanes: members with their own devices or thread budgets step concurrently, and nothing changes.

The concurrency checks use barriers, not clocks: two calls that each wait for the other can only
both pass if they run at the same time. Then every method over two tiny random-weight models
(two real tokenizer families), each member in a lane of its own, writes exactly what it writes with
every member in the calling thread, greedy and sampled.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from ensemble_core import Ensemble, HFMember
from ensemble_core.errors import ConfigError
from ensemble_core.members.lanes import Lanes, lane_key
from ensemble_core.methods import SAFE, Contrastive, GaC, SpecFuse, SweetSpan, UniTE

BARRIER_SECONDS = 30  # generous: a sequential run fails with BrokenBarrierError, a slow one passes


def test_lane_keys_follow_devices_and_budgets() -> None:
    assert lane_key(torch.device("cpu"), None, "a") is None  # the calling thread, as before
    assert lane_key(torch.device("cpu"), 1, "a") == "cpu:a"  # its own lane
    assert lane_key(torch.device("cuda", 1), None, "a") == "cuda:1"  # one lane per GPU
    assert lane_key(torch.device("cuda", 1), None, "b") == "cuda:1"
    # a member hosted elsewhere only waits on the wire: a lane of its own, whatever its device
    assert lane_key(torch.device("cpu"), None, "a", remote=True) == "remote:a"
    assert lane_key(torch.device("cuda", 1), None, "a", remote=True) == "remote:a"


def test_members_in_different_lanes_run_at_the_same_time_with_their_budgets() -> None:
    lanes = Lanes({0: "cpu:a", 1: "cpu:b", 2: None}, {0: 1, 1: 1, 2: None})
    caller_threads = torch.get_num_threads()
    meet = threading.Barrier(2, timeout=BARRIER_SECONDS)

    def lane_work() -> tuple[str, int]:
        meet.wait()  # returns only once the other lane's call runs too
        return threading.current_thread().name, torch.get_num_threads()

    def inline_work() -> tuple[str, int]:
        return threading.current_thread().name, torch.get_num_threads()

    try:
        found = lanes.run({0: lane_work, 1: lane_work, 2: inline_work})
    finally:
        lanes.close()
    assert list(found) == [0, 1, 2]
    assert found[0] == ("ensemble-lane-cpu:a", 1)
    assert found[1] == ("ensemble-lane-cpu:b", 1)
    assert found[2] == (threading.current_thread().name, caller_threads)
    assert torch.get_num_threads() == caller_threads  # making the lanes left the caller's budget alone


def test_members_sharing_a_lane_run_back_to_back_in_order() -> None:
    lanes = Lanes({0: "cuda:0", 1: "cuda:0", 2: "cpu:c"}, {2: 1})
    order: list[tuple[int, str]] = []

    def work(member: int):
        return lambda: order.append((member, threading.current_thread().name))

    try:
        lanes.run({1: work(1), 0: work(0), 2: work(2)})
    finally:
        lanes.close()
    shared = [entry for entry in order if entry[0] in (0, 1)]
    assert shared == [(1, "ensemble-lane-cuda:0"), (0, "ensemble-lane-cuda:0")]


def test_a_failing_member_call_is_raised_after_the_others_end() -> None:
    lanes = Lanes({0: "cpu:a", 1: "cpu:b"}, {0: 1, 1: 1})
    finished = threading.Event()
    meet = threading.Barrier(2, timeout=BARRIER_SECONDS)

    def fails() -> None:
        meet.wait()
        raise ValueError("member a failed")

    def slow() -> None:
        meet.wait()
        threading.Event().wait(0.2)
        finished.set()

    try:
        with pytest.raises(ValueError, match="member a failed"):
            lanes.run({0: fails, 1: slow})
        assert finished.is_set()  # nothing still runs once run() has raised
        assert lanes.run({0: lambda: 1, 1: lambda: 2}) == {0: 1, 1: 2}  # the lanes still work
    finally:
        lanes.close()


def test_a_bad_thread_budget_is_refused_before_loading() -> None:
    with pytest.raises(ConfigError, match="num_threads"):
        HFMember.from_pretrained("no-such-model-folder", num_threads=0)


METHODS = {
    "gac": GaC(),
    "unite": UniTE(),
    "gate": GaC(threshold=0.5),
    "safe": SAFE(),
    "sweetspan": SweetSpan(),
    "specfuse": SpecFuse(segment_tokens=4),
    "contrastive": Contrastive(),
}
TINY = ("tiny-llama", "tiny-qwen2")  # two tokenizer families; Gemma's 262k vocabulary adds time, not cases


def _members(tiny_member, num_threads: int | None) -> list[HFMember]:
    """The three tiny models (shared with other tests), as members with the given thread budget."""
    return [
        HFMember(tiny_member(name).model, tiny_member(name).tokenizer, name=name, num_threads=num_threads)
        for name in TINY
    ]


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_writes_the_same_text_with_members_in_their_own_lanes(name: str, tiny_member) -> None:
    prompts = ["def add(a, b):\n    ", "你好，世界！\n\n"]
    inline = Ensemble(_members(tiny_member, None), method=METHODS[name]).generate_batch(prompts, max_new_tokens=12)
    seen: list[str] = []
    members = _members(tiny_member, 1)
    hooks = [
        m.model.register_forward_pre_hook(lambda *_: seen.append(threading.current_thread().name)) for m in members
    ]
    try:
        with Ensemble(members, method=METHODS[name]) as laned:
            concurrent = laned.generate_batch(prompts, max_new_tokens=12)
    finally:
        for hook in hooks:
            hook.remove()
    assert [r.text for r in concurrent] == [r.text for r in inline]
    assert [r.token_ids for r in concurrent] == [r.token_ids for r in inline]
    assert seen and all(thread.startswith("ensemble-lane-cpu:tiny-") for thread in seen)
    assert not [t for t in threading.enumerate() if t.name.startswith("ensemble-lane-")]  # close() ended them


@pytest.mark.parametrize("name", ["sweetspan", "specfuse", "safe"])
def test_sampled_drafts_do_not_depend_on_concurrency(name: str, tiny_member) -> None:
    settings = dict(max_new_tokens=12, temperature=0.9, seed=7)
    inline = Ensemble(_members(tiny_member, None), method=METHODS[name]).generate("Once upon a time,", **settings)
    with Ensemble(_members(tiny_member, 1), method=METHODS[name]) as laned:
        first = laned.generate("Once upon a time,", **settings)
        again = laned.generate("Once upon a time,", **settings)
    assert first.text == again.text == inline.text


def test_an_ensemble_dropped_without_close_ends_its_lanes(tiny_member) -> None:
    ensemble = Ensemble(_members(tiny_member, 1), method=GaC())
    assert len([t for t in threading.enumerate() if t.name.startswith("ensemble-lane-cpu:tiny-")]) == 2
    del ensemble
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith("ensemble-lane-cpu:tiny-")]
