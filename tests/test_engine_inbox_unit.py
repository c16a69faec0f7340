"""The event loop never waits on the engine: while the worker saves a slot's KV to host memory
(slow on a big model), /health, /metrics and a cancel answer at once; a step's pieces reach the
loop in one hand-over; the loop's own lag is measured and shown on /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from fakes import FakeBackend
from helpers import wait_until
from multiseq import FinishReason, Request, SamplingParams
from multiseq.formats.reader import PromptItem
from multiseq.server import ServerSettings, create_app
from multiseq.server.jobs import MAX_CHUNKS_PER_SECOND, PieceEvent
from multiseq.server.metrics import LoopLagMonitor
from multiseq.server.state import ServerState
from multiseq.server.waker import LoopWaker
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import load  # noqa: E402 - bench/ is a folder of scripts, not a package

MODEL = "fake-model"
SAVE_SECONDS = 0.5  # a KV save as slow as a big model's
# What "at once" means for the loop: well inside the save (each test also checks that the answer
# came while the save ran). Quiet, the answers take a few milliseconds; a CI machine running other
# tests must not fail them, so the bound is half the save, not the 50 ms.
PROMPT_ANSWER_SECONDS = SAVE_SECONDS / 2
RUNNER_THREAD = "multiseq-runner"
# Long enough that the slot's KV is worth saving when another prompt takes the slot.
FIRST_PROMPT = "the first conversation, long enough to be kept in host memory: " * 2
SECOND_PROMPT = "a different conversation that needs the only slot"


class SlowSaveBackend(FakeBackend):
    """Saving a slot's state to host memory takes SAVE_SECONDS; `saving` is set as it starts."""

    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.saving = threading.Event()

    def save_slot(self, slot: int) -> bytearray | None:
        self.saving.set()
        time.sleep(SAVE_SECONDS)
        return super().save_slot(slot)


def timed_get(base: str, path: str) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one GET."""
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    started = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - started
    connection.close()
    return response.status, body, elapsed


def runner_saving_a_slot(make_runner, backend: SlowSaveBackend):
    """A one-slot runner whose slot holds a finished conversation worth saving."""
    runner = make_runner(backend)
    first = runner.submit(Request(prompt=FIRST_PROMPT, sampling=SamplingParams(max_tokens=8, temperature=0)))
    assert first.result(timeout=10).ok and not backend.saves
    return runner


def prompt_item(prompt: str, max_tokens: int) -> PromptItem:
    return PromptItem(line_number=0, id="line", request=Request(
        prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0)))


def test_health_and_metrics_answer_at_once_while_the_worker_saves_a_slot(make_runner, serve_app):
    backend = SlowSaveBackend(num_slots=1, window=512)
    runner = runner_saving_a_slot(make_runner, backend)
    base = serve_app(create_app(runner, ServerSettings(model_name=MODEL)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    answers = []
    second = threading.Thread(target=lambda: answers.append(client.completions.create(
        model=MODEL, prompt=SECOND_PROMPT, max_tokens=4, temperature=0)))
    second.start()
    assert backend.saving.wait(10), "the second prompt's admission saves the first conversation's slot"
    health = timed_get(base, "/health")
    metrics = timed_get(base, "/metrics")
    still_saving = len(backend.saves) == 0  # save_slot notes the slot only once its sleep is over
    second.join(10)
    assert still_saving, "both answers came while the save ran"
    assert health[0] == 200 and health[2] < PROMPT_ANSWER_SECONDS, f"/health took {health[2]:.3f} s"
    assert metrics[0] == 200 and metrics[2] < PROMPT_ANSWER_SECONDS, f"/metrics took {metrics[2]:.3f} s"
    assert b"multiseq_slots 1.0" in metrics[1]
    assert answers and answers[0].choices[0].finish_reason == "length"


def test_a_cancel_from_the_loop_returns_at_once_while_the_worker_saves_a_slot(make_runner):
    backend = SlowSaveBackend(num_slots=1, window=512)
    runner = runner_saving_a_slot(make_runner, backend)
    state = ServerState(runner, ServerSettings(model_name=MODEL))

    async def cancel_during_the_save():
        job = await state.submit(runner, prompt_item(SECOND_PROMPT, max_tokens=200))
        assert await asyncio.to_thread(backend.saving.wait, 10), "admitting the job saves the slot"
        started = time.perf_counter()
        job.cancel()
        cancel_seconds = time.perf_counter() - started
        still_saving = len(backend.saves) == 0
        return cancel_seconds, still_saving, await asyncio.wait_for(job.all_results(), 10)

    cancel_seconds, still_saving, [result] = asyncio.run(cancel_during_the_save())
    state.close()
    assert still_saving and cancel_seconds < PROMPT_ANSWER_SECONDS, f"the cancel took {cancel_seconds:.3f} s"
    assert result.finish_reason is FinishReason.CANCELLED
    assert result.completion_tokens < 200


def test_a_steps_pieces_reach_the_loop_in_one_hand_over(make_runner, monkeypatch):
    """8 streams: one wake-up of the loop from the runner's thread per step, not per piece,
    and each stream's text is the text the runner alone produces."""
    num_streams, max_tokens = 8, 20
    prompts = [f"stream number {index}" for index in range(num_streams)]
    alone = make_runner(FakeBackend(num_slots=num_streams))
    expected = [result.text for result in alone.run_batch(
        Request(prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0)) for prompt in prompts)]
    runner = make_runner(FakeBackend(num_slots=num_streams), autostart=False)
    state = ServerState(runner, ServerSettings(model_name=MODEL))
    hand_overs = []

    async def stream(job) -> str:
        return "".join([event.piece.text async for event in job.events_until_complete()
                        if isinstance(event, PieceEvent)])

    wake = LoopWaker.wake

    def counted(waker: LoopWaker) -> None:
        if threading.current_thread().name == RUNNER_THREAD:
            hand_overs.append(waker)
        wake(waker)

    monkeypatch.setattr(LoopWaker, "wake", counted)

    async def run_streams() -> list[str]:
        jobs = [await state.submit(runner, prompt_item(prompt, max_tokens)) for prompt in prompts]
        runner.start()
        return await asyncio.wait_for(asyncio.gather(*(stream(job) for job in jobs)), 10)

    texts = asyncio.run(run_streams())
    state.close()
    assert texts == expected and all(len(text) == max_tokens for text in texts)
    num_steps = runner.stats().num_steps
    assert 1 <= len(hand_overs) <= num_steps, f"{len(hand_overs)} hand-overs for {num_steps} steps"
    assert num_streams * max_tokens >= 4 * len(hand_overs), "many pieces per hand-over"


def test_a_steps_output_is_told_as_the_next_decode_begins_and_at_once_when_none_follows(make_runner):
    """The delivery listeners (a server's hand-over to its loop) hear of a step's pieces just
    before the next step's decode, where llama.cpp lets go of the GIL, not as the step ends
    (the loop would take the GIL while the engine plans); after a step that leaves nothing to
    decode, at once: the last result never waits for a step that does not come."""
    backend = FakeBackend(num_slots=1)
    runner = make_runner(backend)
    told, decodes = [], []
    decode = backend.decode

    def counted(entries):
        decodes.append(len(told))
        return decode(entries)

    backend.decode = counted
    runner.add_delivery_listener(lambda: told.append(len(decodes)))
    handle = runner.submit(Request(prompt="hello", sampling=SamplingParams(max_tokens=3, temperature=0,
                                                                            ignore_eos=True)))
    assert handle.result(timeout=5).completion_tokens == 3
    runner.close()  # the worker has told what it handed out
    assert decodes == [0, 1, 2], "each step's output is told before the next decode (the first has none)"
    assert told == [1, 2, 3], "the last step's output is told at once, with no decode to wait for"


def test_metrics_show_the_event_loop_lag(make_runner, serve_app):
    runner = make_runner(FakeBackend())
    base = serve_app(create_app(runner, ServerSettings(model_name=MODEL)))

    def lag_count() -> float:
        for line in timed_get(base, "/metrics")[1].decode().splitlines():
            if line.startswith("multiseq_event_loop_lag_seconds_count "):
                return float(line.split()[1])
        return 0.0

    wait_until(lambda: lag_count() >= 2, 10, "the loop-lag task's wake-ups on /metrics")
    text = timed_get(base, "/metrics")[1].decode()
    assert "# TYPE multiseq_event_loop_lag_max_seconds gauge" in text
    assert 'multiseq_event_loop_lag_seconds_bucket{le="0.005"}' in text
    lag_ms = load.loop_lag_max_ms(load.scrape_metrics(int(base.rsplit(":", 1)[1])))  # what bench/load.py reports
    assert lag_ms is not None and 0 <= lag_ms < 10_000


def test_the_loop_lag_monitor_sees_a_blocked_loop_and_its_maximum_resets_at_each_scrape():
    monitor = LoopLagMonitor(CollectorRegistry())

    async def block_the_loop() -> None:
        monitor.start()
        await asyncio.sleep(0.01)  # the task is asleep
        time.sleep(0.2)  # what a lock taken on the loop does
        await asyncio.sleep(0.1)  # the task wakes, late
        monitor.stop()

    asyncio.run(block_the_loop())
    [gauge] = monitor.collect()
    assert gauge.samples[0].value >= 0.1
    [again] = monitor.collect()
    assert again.samples[0].value == 0.0, "the maximum is since the previous scrape"


@pytest.mark.parametrize("cancel_all", [False, True])
def test_a_cancel_posted_for_a_queued_request_ends_it_at_the_next_step(make_runner, cancel_all):
    """cancel_soon and cancel_all_soon only post: the request ends cancelled at the next step."""
    runner = make_runner(FakeBackend(num_slots=1), autostart=False)
    handle = runner.submit(Request(prompt="queued", sampling=SamplingParams(max_tokens=50, temperature=0)))
    assert runner.num_waiting == 1
    if cancel_all:
        runner.cancel_all_soon()
    else:
        runner.cancel_soon(handle.id)
    assert not handle.done, "nothing happens until the worker drains its inbox"
    runner.start()
    result = handle.result(timeout=5)
    assert result.finish_reason is FinishReason.CANCELLED and result.completion_tokens == 0
    wait_until(lambda: runner.latest_snapshot.num_cancelled == 1, 5, "the snapshot published after the cancel")
    assert runner.num_waiting == 0


def test_pieces_queued_behind_a_slow_reader_come_joined_with_the_same_text(make_runner):
    """A reader that falls behind gets each choice's queued pieces as one (one chunk to send
    where there were many); the text is what the runner made, choice by choice."""
    max_tokens = 12
    alone = make_runner(FakeBackend(num_slots=2))
    expected = alone.run_batch([Request(prompt="a slow reader", sampling=SamplingParams(
        max_tokens=max_tokens, temperature=0))])[0].text
    runner = make_runner(FakeBackend(num_slots=2), autostart=False)
    state = ServerState(runner, ServerSettings(model_name=MODEL))

    async def read_after_the_run(n: int) -> list[PieceEvent]:
        item = dataclasses.replace(prompt_item("a slow reader", max_tokens), n=n)
        job = await state.submit(runner, item)
        runner.start()  # every step is done before the reader reads anything (the loop waits here)
        wait_until(lambda: runner.num_waiting == 0 and runner.snapshot().num_running == 0, 10, "the run's end")
        await asyncio.sleep(0)  # the loop takes the runner's hand-overs
        return [event async for event in job.events_until_complete() if isinstance(event, PieceEvent)]

    [joined] = asyncio.run(read_after_the_run(1))
    assert joined.piece.text == expected and len(expected) == max_tokens
    both = asyncio.run(read_after_the_run(2))
    state.close()
    assert ["".join(event.piece.text for event in both if event.choice == choice) for choice in (0, 1)] == \
        [expected, expected], "two choices' pieces alternate: each choice's text stays whole and in order"


def test_with_a_stream_interval_each_chunk_carries_the_steps_since_the_last_one(make_runner, serve_app):
    """serve --stream-interval: the loop takes the runner's pieces at most that often, so a
    stream's chunks come no more often (each carrying several steps' text), and the streamed
    text is the text of the same request not streamed."""
    interval, max_tokens = 0.05, 30
    runner = make_runner(FakeBackend(num_slots=2, decode_delay=0.004))  # 30 steps: at least 0.12 s
    base = serve_app(create_app(runner, ServerSettings(model_name=MODEL, stream_interval_s=interval)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    question = dict(model=MODEL, max_tokens=max_tokens, temperature=0, messages=[{"role": "user", "content": "Hi"}])
    whole = client.chat.completions.create(**question).choices[0].message.content
    started = time.perf_counter()
    pieces = [chunk.choices[0].delta.content for chunk in client.chat.completions.create(**question, stream=True)
              if chunk.choices and chunk.choices[0].delta.content]
    seconds = time.perf_counter() - started
    assert "".join(pieces) == whole and len(whole) == max_tokens
    # The first take comes at once, each later one at least `interval` after the one before.
    assert len(pieces) <= 1 + seconds / interval, f"{len(pieces)} chunks in {seconds:.3f} s"
    with pytest.raises(ValueError, match="stream_interval_s"):
        ServerSettings(model_name=MODEL, stream_interval_s=2.0)


def test_the_automatic_stream_interval_grows_with_the_streams_being_fed(make_runner):
    """stream_interval_s=None (serve's default, auto): after a take that fed N streams the loop
    waits N / MAX_CHUNKS_PER_SECOND, so 32 streams of a fast model get several steps per chunk
    (a few streams would get every step), and each stream's text is the runner's own."""
    num_streams, max_tokens = 32, 20
    interval = num_streams / MAX_CHUNKS_PER_SECOND
    prompts = [f"stream number {index}" for index in range(num_streams)]
    alone = make_runner(FakeBackend(num_slots=num_streams))
    expected = [result.text for result in alone.run_batch(
        Request(prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0)) for prompt in prompts)]
    runner = make_runner(FakeBackend(num_slots=num_streams, decode_delay=0.004), autostart=False)
    state = ServerState(runner, ServerSettings(model_name=MODEL, stream_interval_s=None))

    async def stream(job) -> list[str]:
        return [event.piece.text async for event in job.events_until_complete() if isinstance(event, PieceEvent)]

    async def run_streams() -> list[list[str]]:
        jobs = [await state.submit(runner, prompt_item(prompt, max_tokens)) for prompt in prompts]
        runner.start()
        return await asyncio.wait_for(asyncio.gather(*(stream(job) for job in jobs)), 30)

    started = time.perf_counter()
    pieces = asyncio.run(run_streams())
    seconds = time.perf_counter() - started
    state.close()
    assert ["".join(stream) for stream in pieces] == expected
    # Every take feeds all 32 streams (they start and end together) but the first and last.
    most = max(len(stream) for stream in pieces)
    assert most <= 2 + seconds / interval, f"{most} chunks in {seconds:.3f} s"
