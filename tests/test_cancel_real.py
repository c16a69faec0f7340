"""Cancellation and live admission on a real model, where timing matters."""

from __future__ import annotations

import threading

import pytest

from helpers import assert_same_greedy_texts
from multiseq import CANCELLED_BEFORE_START, FinishReason, Request, SamplingParams

pytestmark = pytest.mark.model


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def record_steps(runner) -> list[list[str]]:
    """Wrap the backend's decode to note which requests were in each step's batch."""
    steps: list[list[str]] = []
    decode = runner.backend.decode
    slots = runner.engine.scheduler.slots

    def recording_decode(entries):
        steps.append([slots[entry.slot].holder.id for entry in entries])
        return decode(entries)

    runner.backend.decode = recording_decode
    return steps


def run_with_consumers(runner, handles, on_piece) -> list:
    """Start the runner with one thread draining each streaming handle; on_piece(index,
    handle, piece, count) sees every piece. Returns the results in handle order."""

    def consume(index: int, handle) -> None:
        for count, piece in enumerate(handle, start=1):
            on_piece(index, handle, piece, count)

    consumers = [threading.Thread(target=consume, args=(index, handle)) for index, handle in enumerate(handles)]
    for consumer in consumers:
        consumer.start()
    runner.start()
    results = [handle.result(timeout=60) for handle in handles]
    for consumer in consumers:
        consumer.join(timeout=10)
    return results


def test_cancel_all_at_the_first_token_stops_two_in_flight_and_drains_four_queued(smollm, real_runner,
                                                                                  assert_slots_hold_only_kept_prefixes):
    with real_runner(smollm, parallel=2, autostart=False) as runner:
        handles = [runner.submit(Request(prompt=f"Story {index}:", id=f"c{index}", sampling=greedy(100)), stream=True)
                   for index in range(6)]
        pieces: dict[str, list[str]] = {handle.id: [] for handle in handles}
        cancelled = threading.Event()

        def on_piece(_index, handle, piece, _count) -> None:
            pieces[handle.id].append(piece)
            if not cancelled.is_set():
                runner.cancel_all()
                cancelled.set()

        results = run_with_consumers(runner, handles, on_piece)
        assert_slots_hold_only_kept_prefixes(runner)
    in_flight, queued = results[:2], results[2:]
    assert all(r.finish_reason is FinishReason.CANCELLED and r.error is None for r in in_flight)
    assert all(1 <= r.completion_tokens < 100 and r.text for r in in_flight)
    assert all(r.finish_reason is FinishReason.CANCELLED and r.error == CANCELLED_BEFORE_START for r in queued)
    assert all(r.completion_tokens == 0 and pieces[r.id] == [] for r in queued), "no queued prompt emitted a token"


def test_cancelling_one_in_flight_request_leaves_the_others_exact(smollm, real_runner,
                                                                  assert_slots_hold_only_kept_prefixes):
    prompts = ["The history of tea:", "How bridges are built:", "A walk in the forest:"]

    def run(cancel_middle: bool) -> list:
        with real_runner(smollm, parallel=3, autostart=False) as runner:
            handles = [runner.submit(Request(prompt=p, sampling=greedy(40)), stream=True) for p in prompts]

            def on_piece(index, handle, _piece, count) -> None:
                if cancel_middle and index == 1 and count == 5:
                    assert runner.cancel(handle.id)

            results = run_with_consumers(runner, handles, on_piece)
            assert_slots_hold_only_kept_prefixes(runner)
        return results

    cancelled, untouched = run(cancel_middle=True), run(cancel_middle=False)
    assert cancelled[1].finish_reason is FinishReason.CANCELLED and cancelled[1].completion_tokens < 40
    assert untouched[1].text.startswith(cancelled[1].text)
    # After the cancel the other two decode two to a step instead of three.
    assert_same_greedy_texts([cancelled[0].text, cancelled[2].text], [untouched[0].text, untouched[2].text], smollm,
                             "the requests beside a cancelled one write what they write without the cancel")


def test_requests_from_four_threads_join_a_running_batch(smollm, real_runner, assert_slots_hold_only_kept_prefixes):
    with real_runner(smollm, parallel=8) as runner:
        steps = record_steps(runner)
        early = [runner.submit(Request(prompt=f"Early {index}:", id=f"early{index}", sampling=greedy(60)))
                 for index in range(3)]
        late_handles = []

        def submit_from_thread(thread_index: int) -> None:
            for index in range(2):
                request = Request(prompt=f"Thread {thread_index} item {index}:", id=f"t{thread_index}-{index}",
                                  sampling=greedy(12))
                late_handles.append(runner.submit(request))

        threads = [threading.Thread(target=submit_from_thread, args=(index,)) for index in range(4)]
        for thread in threads:  # the early requests (60 tokens each) are decoding meanwhile
            thread.start()
        for thread in threads:
            thread.join()
        results = [handle.result(timeout=60) for handle in early + late_handles]
        assert_slots_hold_only_kept_prefixes(runner)
    assert len(results) == 11 and all(r.ok for r in results)
    assert any(any(i.startswith("early") for i in step) and any(i.startswith("t") for i in step) for step in steps), \
        "a late request decoded in the same step as an early one"


def test_a_request_failing_at_admission_does_not_disturb_the_others(smollm, real_runner,
                                                                    assert_slots_hold_only_kept_prefixes):
    long_prompt = "word " * 600

    def texts(with_bad: bool) -> list[str]:
        requests = [Request(prompt="The moon is", sampling=greedy(20)), Request(prompt="Rivers flow", sampling=greedy(20))]
        if with_bad:
            requests.insert(1, Request(prompt=long_prompt, overflow="reject", sampling=greedy(20)))
        with real_runner(smollm, parallel=2, slot_ctx=256) as runner:
            results = runner.run_batch(requests)
            assert_slots_hold_only_kept_prefixes(runner)
        if with_bad:
            assert results[1].finish_reason is FinishReason.ERROR and "reject" in results[1].error
            del results[1]
        return [result.text for result in results]

    # The failed request changes when the second good one gets a slot, so what shares their steps.
    assert_same_greedy_texts(texts(with_bad=True), texts(with_bad=False), smollm,
                             "the requests beside one failing at admission write what they write without it")
