"""The runner driven from many threads at once, on the fake backend: what a server does to it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fakes import FakeBackend
from multiseq import CANCELLED_BEFORE_START, FinishReason, Request, SamplingParams

LONG = SamplingParams(max_tokens=60, temperature=0)


def test_clearing_the_prefix_cache_waits_for_the_step_and_never_touches_the_kv_mid_decode(make_runner):
    """Short requests keep leaving prompts in idle slots while two long ones decode; other
    threads keep clearing the kept prompts. No KV change may land while a decode runs."""
    backend = FakeBackend(num_slots=4, decode_delay=0.005)
    runner = make_runner(backend)
    long = [runner.submit(Request(prompt=f"long request {index}", sampling=LONG)) for index in range(2)]
    short = SamplingParams(max_tokens=1, temperature=0)
    stop = threading.Event()

    def clear_repeatedly() -> None:
        while not stop.is_set():
            runner.clear_prefix_cache()

    clearers = [threading.Thread(target=clear_repeatedly) for _ in range(2)]
    for thread in clearers:
        thread.start()
    shorts = []
    while not all(handle.done for handle in long):
        shorts.append(runner.submit(Request(prompt=f"short request {len(shorts)}", sampling=short)))
        shorts[-1].result(timeout=30)
    stop.set()
    for thread in clearers:
        thread.join()
    assert all(handle.result().ok for handle in long + shorts)
    assert backend.kv_changes_during_decode == [], "the KV changed while llama_decode ran"
    runner.clear_prefix_cache()
    assert all(len(runner.engine.scheduler.slots[slot].kept) == 0 and backend.kv[slot] == []
               for slot in range(4)), "once the call returns, every idle slot is cleared"
    runner.close()


def submit_slowly(runner, backend, prompt: str):
    """Submit `prompt` on another thread whose tokenizing waits for release(); returns once
    tokenizing has begun, with (thread, handles, release)."""
    entered, release = threading.Event(), threading.Event()
    real_tokenize = backend.tokenize

    def tokenize(text: str) -> list[int]:
        if text == prompt:
            entered.set()
            assert release.wait(10)
        return real_tokenize(text)

    backend.tokenize = tokenize
    handles = []
    thread = threading.Thread(target=lambda: handles.append(runner.submit(Request(prompt=prompt, id="slow"))))
    thread.start()
    assert entered.wait(10)
    return thread, handles, release


def never_prefilled(backend, prompt: str) -> bool:
    return all(backend.prompts[slot] != backend.tokenize(prompt) for slot in range(backend.num_slots)) and \
        not any(is_prefill for call in backend.calls for _, _, is_prefill in call.entries)


def test_a_request_cancelled_while_it_is_tokenized_never_runs(make_runner):
    backend = FakeBackend(num_slots=1)
    runner = make_runner(backend)
    thread, handles, release = submit_slowly(runner, backend, "slow prompt")
    assert runner.cancel("slow") is True, "the id is known from the moment submit() was called"
    release.set()
    thread.join()
    result = handles[0].result(timeout=10)
    assert result.finish_reason is FinishReason.CANCELLED and result.error == CANCELLED_BEFORE_START
    assert never_prefilled(backend, "slow prompt")
    runner.close()


def test_cancel_all_alone_reaches_a_request_being_tokenized(make_runner):
    """No close behind it: the request is ended by cancel_all, and nothing else, once it is queued."""
    backend = FakeBackend(num_slots=1)
    runner = make_runner(backend)
    thread, handles, release = submit_slowly(runner, backend, "slow prompt")
    assert runner.cancel_all() == 1
    release.set()
    thread.join()
    result = handles[0].result(timeout=10)
    assert result.finish_reason is FinishReason.CANCELLED and result.error == CANCELLED_BEFORE_START
    assert never_prefilled(backend, "slow prompt")
    later = runner.submit(Request(prompt="later", sampling=SamplingParams(max_tokens=2)))
    assert later.result(timeout=10).ok, "a request submitted after cancel_all returned runs"
    runner.close()


def test_cancel_all_and_close_reach_a_request_being_tokenized(make_runner):
    backend = FakeBackend(num_slots=1)
    runner = make_runner(backend)
    thread, handles, release = submit_slowly(runner, backend, "slow prompt")
    assert runner.cancel_all() == 1
    closer = threading.Thread(target=runner.close)
    closer.start()
    release.set()
    thread.join()
    closer.join(10)
    assert not closer.is_alive()
    result = handles[0].result(timeout=10)
    assert result.finish_reason is FinishReason.CANCELLED and result.error == CANCELLED_BEFORE_START
    assert never_prefilled(backend, "slow prompt")


def test_a_callback_that_waits_for_the_engine_is_told_it_cannot_instead_of_hanging(make_runner):
    """on_finish runs on the engine's own thread: a blocking call there would wait for itself."""
    runner = make_runner(FakeBackend(num_slots=1))
    raised: list[BaseException] = []

    def on_finish(result) -> None:
        try:
            runner.stats()
        except RuntimeError as error:
            raised.append(error)

    handle = runner.submit(Request(prompt="p", sampling=SamplingParams(max_tokens=2)), on_finish=on_finish)
    assert handle.result(timeout=10).ok
    assert len(raised) == 1 and "cannot wait for a step to end" in str(raised[0])
    assert runner.stats().num_admitted == 1, "the runner goes on"
    runner.close()


def test_a_runner_not_started_starts_on_the_first_calls_from_several_threads(make_runner):
    """autostart=False: what is submitted waits; the first calls that wait for the worker start
    it, however many threads make them at once."""
    runner = make_runner(FakeBackend(num_slots=2), autostart=False)
    handle = runner.submit(Request(prompt="queued", sampling=SamplingParams(max_tokens=3, temperature=0)))
    time.sleep(0.05)
    assert not handle.done and runner.num_waiting == 1, "nothing runs before the worker starts"
    with ThreadPoolExecutor(8) as pool:
        totals = list(pool.map(lambda _: runner.stats(), range(8)))
    assert len(totals) == 8 and handle.result(timeout=5).ok


def test_an_idle_worker_sleeps_while_a_request_is_prepared(make_runner):
    """A request being prepared (a long prompt tokenized, a schema compiled) on its caller's
    thread gives the idle worker nothing to do: it waits for the prepared sequence instead of
    turning (each turn plans, and publishes a snapshot); a close meanwhile still waits for it."""
    runner = make_runner(FakeBackend(num_slots=4))
    turns = []
    schedule = runner.engine.schedule
    runner.engine.schedule = lambda: (turns.append(1), schedule())[1]
    make = runner._maker.new_sequence
    turns_while_preparing, preparing = [], threading.Event()

    def slow(*args, **options):
        preparing.set()
        before = len(turns)
        time.sleep(0.3)
        turns_while_preparing.append(len(turns) - before)
        return make(*args, **options)

    runner._maker.new_sequence = slow
    handle = runner.submit(Request(prompt="slow to prepare", sampling=SamplingParams(max_tokens=2, temperature=0)))
    assert handle.result(timeout=5).ok
    assert turns_while_preparing[0] <= 1, f"{turns_while_preparing[0]} turns while the request was prepared " \
        "(one applies its arrival)"
    late = []
    submitting = threading.Thread(target=lambda: late.append(runner.submit(Request(prompt="late", sampling=LONG))))
    preparing.clear()
    submitting.start()
    assert preparing.wait(5)  # it has arrived, and is being prepared
    runner.close()
    submitting.join(5)
    assert late[0].result(timeout=1).finish_reason is FinishReason.CANCELLED, "the close waited for it, and ended it"
