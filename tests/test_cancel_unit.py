"""Cancel and cancel_all on the fake backend: exact, step by step."""

from __future__ import annotations

import threading
import time

from fakes import FakeBackend
from multiseq import CANCELLED_BEFORE_START, FinishReason, Request, SamplingParams

LONG = SamplingParams(max_tokens=40, temperature=0)


def run_steps(runner, count: int) -> None:
    for _ in range(count):
        runner.step()


def test_cancelling_a_waiting_request_ends_it_with_an_error_and_it_never_runs(make_runner):
    backend = FakeBackend(num_slots=1)
    runner = make_runner(backend, autostart=False)
    running = runner.submit(Request(prompt="first", sampling=LONG))
    waiting = runner.submit(Request(prompt="second", sampling=LONG))
    run_steps(runner, 2)
    assert runner.cancel(waiting.id) is True
    result = waiting.result(timeout=1)
    assert result.finish_reason is FinishReason.CANCELLED and result.error == CANCELLED_BEFORE_START
    assert not result.ok and result.text == ""
    while runner.step():
        pass
    prefills = [entry for call in backend.calls for entry in call.entries if entry[2]]
    assert len(prefills) == 1, "only the first request was ever prefilled"
    assert running.result().ok
    runner.close()


def test_cancelling_a_running_request_keeps_its_text_and_frees_its_slot_that_step(make_runner):
    backend = FakeBackend(num_slots=2)
    runner = make_runner(backend, autostart=False)
    victim = runner.submit(Request(prompt="victim", sampling=LONG))
    other = runner.submit(Request(prompt="other", sampling=LONG))
    run_steps(runner, 4)
    assert runner.cancel(victim.id)
    runner.step()
    result = victim.result(timeout=1)
    assert result.finish_reason is FinishReason.CANCELLED and result.error is None
    assert 1 <= result.completion_tokens <= 4 and len(result.text) == result.completion_tokens
    assert runner.engine.scheduler.slots[0].is_free
    generated_in_kv = list(result.text.encode())[:-1]  # the last token sampled was never decoded
    assert backend.kv[0] == backend.tokenize("victim") + generated_in_kv, "its KV keeps what it computed, for reuse"
    assert runner.engine.scheduler.slots[0].kept.tolist() == backend.kv[0]
    while runner.step():
        pass
    assert other.result().ok and other.result().completion_tokens == LONG.max_tokens
    runner.close()


def test_others_are_unaffected_by_a_cancel(make_runner):
    def texts(cancel: bool) -> list[str]:
        runner = make_runner(FakeBackend(num_slots=3), autostart=False)
        handles = [runner.submit(Request(prompt=f"text {index}", sampling=LONG)) for index in range(3)]
        run_steps(runner, 5)
        if cancel:
            runner.cancel(handles[1].id)
        while runner.step():
            pass
        runner.close()
        return [handles[0].result().text, handles[2].result().text]

    assert texts(cancel=True) == texts(cancel=False)


def test_cancelling_an_unknown_or_finished_request_is_a_no_op_that_says_so(caplog, make_runner):
    runner = make_runner(FakeBackend(), autostart=False)
    handle = runner.submit(Request(prompt="x", sampling=SamplingParams(max_tokens=1, temperature=0)))
    while runner.step():
        pass
    assert handle.result().ok
    with caplog.at_level("INFO", logger="multiseq.runner"):
        assert runner.cancel(handle.id) is False
        assert runner.cancel("never-submitted") is False
    assert "no such waiting or running request" in caplog.text
    runner.close()


def test_cancel_all_drains_the_queue_and_stops_running_requests(make_runner):
    backend = FakeBackend(num_slots=2)
    runner = make_runner(backend, autostart=False)
    handles = [runner.submit(Request(prompt=f"p{index}", sampling=LONG)) for index in range(6)]
    run_steps(runner, 3)
    num_calls = len(backend.calls)
    assert runner.cancel_all() == 6
    while runner.step():
        pass
    results = [handle.result(timeout=1) for handle in handles]
    assert all(result.finish_reason is FinishReason.CANCELLED for result in results)
    assert [result.error for result in results[:2]] == [None, None]
    assert all(result.completion_tokens >= 1 for result in results[:2])
    assert all(result.error == CANCELLED_BEFORE_START for result in results[2:])
    assert len(backend.calls) == num_calls, "nothing was decoded after cancel_all"
    backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)
    after = runner.submit(Request(prompt="after", sampling=SamplingParams(max_tokens=3, temperature=0)))
    while runner.step():
        pass
    assert after.result().ok and after.result().completion_tokens == 3
    runner.close()


def test_cancel_all_is_atomic_against_the_step_in_flight(make_runner):
    backend = FakeBackend(num_slots=2, decode_delay=0.02)
    runner = make_runner(backend)
    first = runner.submit(Request(prompt="p0", sampling=LONG), stream=True)
    rest = [runner.submit(Request(prompt=f"p{index}", sampling=LONG)) for index in range(1, 6)]
    next(iter(first))  # the first token is out: a step is running or about to
    runner.cancel_all()
    returned_at = time.perf_counter()
    results = [first.result(timeout=5)] + [handle.result(timeout=5) for handle in rest]
    later_calls = [call for call in backend.calls if call.started_at > returned_at]
    assert all(not is_prefill for call in later_calls for _, _, is_prefill in call.entries), \
        "no queued request was admitted after cancel_all returned"
    assert sum(result.error == CANCELLED_BEFORE_START for result in results) >= 3
    assert all(result.finish_reason is FinishReason.CANCELLED for result in results)
    runner.close()


def test_a_stream_ends_when_its_request_is_cancelled(make_runner):
    backend = FakeBackend(num_slots=1, decode_delay=0.005)
    runner = make_runner(backend)
    handle = runner.submit(Request(prompt="stream", sampling=SamplingParams(max_tokens=500, temperature=0)), stream=True)
    pieces = []

    def consume() -> None:
        pieces.extend(handle)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.05)
    runner.cancel(handle.id)
    consumer.join(timeout=5)
    assert not consumer.is_alive()
    assert "".join(pieces) == handle.result().text
    assert 0 < handle.result().completion_tokens < 500
    runner.close()
