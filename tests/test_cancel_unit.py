"""Cancel and cancel_all on the fake backend: the engine's aborts step by step, exact; the
runner's cancels from other threads."""

from __future__ import annotations

import threading
import time

from fakes import FakeBackend
from multiseq import CANCELLED_BEFORE_START, FinishReason, Request, SamplingParams

LONG = SamplingParams(max_tokens=40, temperature=0)


def test_cancelling_a_waiting_request_ends_it_with_an_error_and_it_never_runs(stepped_engine):
    backend = FakeBackend(num_slots=1)
    stepped = stepped_engine(backend)
    running = stepped.submit(Request(prompt="first", sampling=LONG))
    waiting = stepped.submit(Request(prompt="second", sampling=LONG))
    stepped.steps(2)
    assert stepped.engine.abort(waiting) is True
    result = stepped.result(waiting)
    assert result.finish_reason is FinishReason.CANCELLED and result.error == CANCELLED_BEFORE_START
    assert not result.ok and result.text == ""
    stepped.run()
    prefills = [entry for call in backend.calls for entry in call.entries if entry[2]]
    assert len(prefills) == 1, "only the first request was ever prefilled"
    assert stepped.result(running).ok


def test_cancelling_a_running_request_keeps_its_text_and_frees_its_slot_that_step(stepped_engine):
    backend = FakeBackend(num_slots=2)
    stepped = stepped_engine(backend)
    victim = stepped.submit(Request(prompt="victim", sampling=LONG))
    other = stepped.submit(Request(prompt="other", sampling=LONG))
    stepped.steps(4)
    assert stepped.engine.abort(victim)
    stepped.step()
    result = stepped.result(victim)
    assert result.finish_reason is FinishReason.CANCELLED and result.error is None
    assert 1 <= result.completion_tokens <= 4 and len(result.text) == result.completion_tokens
    assert stepped.engine.scheduler.slots[0].is_free
    generated_in_kv = list(result.text.encode())[:-1]  # the last token sampled was never decoded
    assert backend.kv[0] == backend.tokenize("victim") + generated_in_kv, "its KV keeps what it computed, for reuse"
    assert stepped.engine.scheduler.slots[0].kept.tolist() == backend.kv[0]
    stepped.run()
    assert stepped.result(other).ok and stepped.result(other).completion_tokens == LONG.max_tokens


def test_others_are_unaffected_by_a_cancel(stepped_engine):
    def texts(cancel: bool) -> list[str]:
        stepped = stepped_engine(FakeBackend(num_slots=3))
        ids = [stepped.submit(Request(prompt=f"text {index}", sampling=LONG)) for index in range(3)]
        stepped.steps(5)
        if cancel:
            stepped.engine.abort(ids[1])
        stepped.run()
        return [stepped.result(ids[0]).text, stepped.result(ids[2]).text]

    assert texts(cancel=True) == texts(cancel=False)


def test_cancelling_an_unknown_or_finished_request_is_a_no_op_that_says_so(caplog, make_runner):
    runner = make_runner(FakeBackend())
    handle = runner.submit(Request(prompt="x", sampling=SamplingParams(max_tokens=1, temperature=0)))
    assert handle.result(timeout=5).ok
    with caplog.at_level("INFO", logger="multiseq.runner"):
        assert runner.cancel(handle.id) is False
        assert runner.cancel("never-submitted") is False
    assert "no such waiting or running request" in caplog.text
    runner.close()


def test_cancel_all_drains_the_queue_and_stops_running_requests(stepped_engine):
    backend = FakeBackend(num_slots=2)
    stepped = stepped_engine(backend)
    ids = [stepped.submit(Request(prompt=f"p{index}", sampling=LONG)) for index in range(6)]
    stepped.steps(3)
    num_calls = len(backend.calls)
    assert stepped.engine.abort_all() == 6
    stepped.run()
    results = [stepped.result(request_id) for request_id in ids]
    assert all(result.finish_reason is FinishReason.CANCELLED for result in results)
    assert [result.error for result in results[:2]] == [None, None]
    assert all(result.completion_tokens >= 1 for result in results[:2])
    assert all(result.error == CANCELLED_BEFORE_START for result in results[2:])
    assert len(backend.calls) == num_calls, "nothing was decoded after cancel_all"
    backend.assert_free_slots_hold_only_kept_prompts(stepped.engine.scheduler)
    after = stepped.submit(Request(prompt="after", sampling=SamplingParams(max_tokens=3, temperature=0)))
    stepped.run()
    assert stepped.result(after).ok and stepped.result(after).completion_tokens == 3


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
