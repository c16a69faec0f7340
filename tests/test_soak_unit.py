"""bench/soak.py on the fake backend, a hundred requests: four agent-like sessions over HTTP with
client disconnects, cancels and an injected fault (one request in 25 here) end every request,
fail only the faulty ones, and leave the engine idle with no slot or KV cell leaked."""

from __future__ import annotations

import sys
from pathlib import Path

from fakes import FakeBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import soak  # noqa: E402 - bench/ is a folder of scripts, not a package


def test_sessions_with_disconnects_cancels_and_faults_leave_nothing_behind(make_runner):
    backend = FakeBackend(num_slots=4, window=4096, n_batch=512, decode_delay=0.002)
    runner = make_runner(backend)
    options = soak.SoakOptions(sessions=4, minutes=None, requests_per_session=25, warmup_minutes=0, max_tokens=24,
                               fault_every=25, disconnect_share=0.1, cancel_share=0.1, seed=3)
    report = soak.soak(runner, options)
    assert report["requests"] == 100
    assert report["faults_injected"] == 4 and report["faults_failed_alone"] == 4, report
    assert report["collateral_failures"] == 0, report["first_errors"]
    assert report["disconnects"] and report["cancels"], "the premise: some clients went away"
    assert report["ok"] + report["faults_injected"] + report["disconnects"] + report["cancels"] == 100
    assert report["client_timeouts"] == 0
    assert report["metrics_after"] == ["multiseq_requests_running 0.0", "multiseq_requests_waiting 0.0"]
    assert report["leaked_slots"] == [] and report["engine_failure"] is None
    backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)
