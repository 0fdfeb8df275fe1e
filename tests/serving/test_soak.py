"""A short soak: a seeded mix of every kind of request against a real server, nothing lost.

`benchmarks/bench_soak.py` is the long run (1,000+ requests, with figures); this runs its same
mix, shorter: chat and completions, whole and streamed, forced tool calls and JSON replies,
clients that go away mid-stream, requests past the server's timeout, and malformed requests
(junk, wrong types, deep JSON, non-UTF-8, oversized, bad keys, unknown routes). Every answer
must be what its kind gets (200 with a whole reply or a stream ending in [DONE], 504, a 4xx in
OpenAI's shape), never a 500; afterwards the batch is empty and the server still answers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_soak import KEY, KINDS, serve_settings, soak, tiny_members

from ensemble_core import Ensemble
from ensemble_core.serving.app import create_app
from ensemble_core.serving.background import serving_in_thread


def test_a_mixed_load_with_faults_and_hostile_input_loses_nothing() -> None:
    with Ensemble(tiny_members(), method="gac") as ensemble:
        app = create_app(ensemble, serve_settings(timeout=4.0))
        with serving_in_thread(app) as base:
            report = soak(base, requests=90, clients=8, seed=1)
            assert not report.problems, report.problems
            assert {kind for kind, _ in report.answers} == set(KINDS)  # every kind was sent
            assert not [status for _, status in report.answers if status == 500]
            assert report.answers["timeout", 504] >= 1
            deadline = time.monotonic() + 30
            while app.state.batcher.load != (0, 0) and time.monotonic() < deadline:
                time.sleep(0.1)  # disconnected and timed-out requests leave at a step boundary
            assert app.state.batcher.load == (0, 0)
            hello = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            after = httpx.post(f"{base}/chat/completions", json=hello, headers={"Authorization": f"Bearer {KEY}"})
            assert after.status_code == 200
