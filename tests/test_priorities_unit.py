"""The step budget, priorities and preemption, on the fake backend (milliseconds, no model).

A step carries every decoding token, then prompt chunks up to its budget; admission and
prefill go by priority, then age; a request that waited too long goes first; a request of
higher priority preempts a lower one, whose KV is parked in host memory and restored, so its
output is the same as if it had never left. The fake's next token depends only on the tokens
in a slot's KV (and, noisy, on a seeded draw of them): a wrong restore changes the text."""

from __future__ import annotations

import time

from fakes import FakeBackend
from helpers import run_until_done
from multiseq import FinishReason, Priority, Request, RunnerConfig, SamplingParams
from multiseq.llama.batch import ChunkRules
from multiseq.loop.engine import Engine
from multiseq.loop.waiting import STARVATION_SECONDS

GREEDY = SamplingParams(max_tokens=40, temperature=0)
SAMPLED = SamplingParams(max_tokens=60, temperature=0.9, seed=11)


def make_engine(backend: FakeBackend, **config) -> Engine:
    settings = dict(parallel=backend.num_slots, slot_ctx=backend.window, n_batch=backend.n_batch, threads=1, seed=0)
    settings.update(config)
    return Engine(RunnerConfig(**settings), backend)


def submit(engine: Engine, request_id: str, prompt: str, sampling: SamplingParams = GREEDY,
           priority: int = Priority.BATCH):
    seq = engine.new_sequence(Request(prompt=prompt, id=request_id, sampling=sampling, priority=priority), request_id)
    engine.add(seq)
    return seq


def alone(prompt: str, sampling: SamplingParams, request_id: str) -> str:
    """The text of one request run by itself, on a fresh engine."""
    engine = make_engine(FakeBackend(num_slots=1, window=512, n_batch=256, noisy=sampling.temperature > 0))
    submit(engine, request_id, prompt, sampling)
    return run_until_done(engine)[request_id].text


# --- the step budget ------------------------------------------------------------------------

def test_a_long_prompt_is_prefilled_over_several_steps_while_every_stream_decodes_each_step():
    backend = FakeBackend(num_slots=4, window=512, n_batch=256, chunk_rules=ChunkRules(8, 4, exact_reuse=False))
    engine = make_engine(backend, step_tokens=24)
    for index in range(3):
        submit(engine, f"s{index}", f"short {index}", SamplingParams(max_tokens=60, temperature=0))
    for _ in range(4):
        engine.step()
    calls_before = len(backend.calls)
    submit(engine, "long", "L" * 200)
    results = run_until_done(engine)
    during = [call for call in backend.calls[calls_before:] if any(is_prefill for _, _, is_prefill in call.entries)]
    assert len(during) >= 200 // 21, "the long prompt took several steps"
    for call in during:
        assert sorted(call.decoding_slots) == sorted(call.slots_with_pending_token), "no stream skipped a step"
        prefill = sum(count for _, count, is_prefill in call.entries if is_prefill)
        assert prefill <= 24 - len(call.decoding_slots), f"a step over its budget: {call.entries}"
    assert all(result.ok for result in results.values())


def test_without_a_budget_the_whole_prompt_goes_in_one_step():
    backend = FakeBackend(num_slots=2, window=512, n_batch=256, chunk_rules=ChunkRules(8, 4, exact_reuse=False))
    engine = make_engine(backend)
    submit(engine, "long", "L" * 200)
    run_until_done(engine)
    assert backend.calls[0].num_tokens == 201  # the BOS and 200 bytes


def test_a_prompt_rest_no_cut_can_split_under_a_small_budget_still_progresses():
    rules = ChunkRules(65, 4, exact_reuse=False)  # the CPU backend's rules
    backend = FakeBackend(num_slots=4, window=512, n_batch=512, chunk_rules=rules)
    engine = make_engine(backend, step_tokens=20)
    for index in range(3):
        submit(engine, f"s{index}", f"short {index}", SamplingParams(max_tokens=30, temperature=0))
    engine.step()
    submit(engine, "mid", "M" * 99)  # 100 tokens: more than the budget, fewer than two chunks of 65
    results = run_until_done(engine, max_steps=200)
    assert results["mid"].ok and results["mid"].completion_tokens == GREEDY.max_tokens
    assert any(count == 100 and is_prefill for call in backend.calls for _, count, is_prefill in call.entries), \
        "its 100 tokens went as one chunk"


# --- priorities -----------------------------------------------------------------------------

def test_admission_goes_by_priority_then_age():
    engine = make_engine(FakeBackend(num_slots=1, window=512, n_batch=256), cache_ram_mib=0)
    submit(engine, "first", "the first batch request")
    engine.step()
    submit(engine, "batch", "a later batch request")
    submit(engine, "chat-1", "an interactive request", priority=Priority.INTERACTIVE)
    submit(engine, "chat-2", "another interactive request", priority=Priority.INTERACTIVE)
    assert list(run_until_done(engine)) == ["first", "chat-1", "chat-2", "batch"]


def test_a_request_that_waited_too_long_goes_before_newer_ones_of_any_priority():
    engine = make_engine(FakeBackend(num_slots=1, window=512, n_batch=256), cache_ram_mib=0)
    submit(engine, "first", "the first batch request")
    engine.step()
    starving = submit(engine, "batch", "a batch request that waited long")
    starving.submitted_at = time.perf_counter() - STARVATION_SECONDS - 1
    submit(engine, "chat", "an interactive request", priority=Priority.INTERACTIVE)
    assert list(run_until_done(engine)) == ["first", "batch", "chat"]


# --- preemption -----------------------------------------------------------------------------

def test_an_interactive_request_preempts_a_batch_one_which_resumes_exactly():
    backend = FakeBackend(num_slots=1, window=512, n_batch=256, noisy=True, state_bytes_per_token=64)
    engine = make_engine(backend)
    submit(engine, "batch", "a long batch job", SAMPLED)
    for _ in range(10):
        engine.step()
    submit(engine, "chat", "hello", SamplingParams(max_tokens=5, temperature=0.9, seed=3),
           priority=Priority.INTERACTIVE)
    results = run_until_done(engine)
    assert list(results) == ["chat", "batch"], "the interactive request did not wait for the batch one"
    assert results["batch"].text == alone("a long batch job", SAMPLED, "batch"), "resumed as if never interrupted"
    assert results["batch"].completion_tokens == SAMPLED.max_tokens
    assert results["chat"].text == alone("hello", SamplingParams(max_tokens=5, temperature=0.9, seed=3), "chat")
    assert engine.stats.snapshot().num_preempted == 1 and backend.restores
    assert engine.host_cache.num_parked_bytes == 0, "the parked state was let go"


def test_equal_priorities_never_preempt_and_without_ram_nothing_is_preempted():
    for config, priority in (({}, Priority.BATCH), ({"cache_ram_mib": 0}, Priority.INTERACTIVE)):
        backend = FakeBackend(num_slots=1, window=512, n_batch=256)
        engine = make_engine(backend, **config)
        submit(engine, "batch", "a long batch job")
        engine.step()
        submit(engine, "other", "hello", priority=priority)
        assert list(run_until_done(engine)) == ["batch", "other"]
        assert engine.stats.snapshot().num_preempted == 0


def test_a_preempted_request_cancelled_while_it_waits_keeps_its_text():
    backend = FakeBackend(num_slots=1, window=512, n_batch=256)
    engine = make_engine(backend)
    submit(engine, "batch", "a long batch job")
    for _ in range(6):
        engine.step()
    submit(engine, "chat", "hello", priority=Priority.INTERACTIVE)
    engine.step()
    assert engine.stats.snapshot().num_preempted == 1
    assert engine.abort("batch")
    result = engine.take_output().finished[0]
    assert result.id == "batch" and result.finish_reason is FinishReason.CANCELLED
    assert result.error is None and len(result.text) >= 5, "what it generated before it left is kept"
    assert engine.host_cache.num_parked_bytes == 0
    assert run_until_done(engine)["chat"].ok


def test_lower_priority_streams_sit_out_the_steps_that_prefill_a_higher_priority_prompt():
    backend = FakeBackend(num_slots=3, window=512, n_batch=256)
    engine = make_engine(backend)
    for index in range(2):
        submit(engine, f"batch-{index}", f"batch job {index}", SamplingParams(max_tokens=30, temperature=0))
    for _ in range(3):
        engine.step()
    before = len(backend.calls)
    submit(engine, "chat", "hello there", SamplingParams(max_tokens=5, temperature=0), priority=Priority.INTERACTIVE)
    engine.step()
    prefill_step = backend.calls[before]
    assert [is_prefill for _, _, is_prefill in prefill_step.entries] == [True], "the chat's prompt alone"
    engine.step()
    assert len(backend.calls[before + 1].decoding_slots) == 3, "then every stream decodes again"
    results = run_until_done(engine)
    assert all(result.ok for result in results.values()) and len(results) == 3


def test_nothing_is_preempted_for_a_request_that_waits_for_a_prefix_being_prefilled():
    shared = "You are the triage assistant; read the ticket and label it. " * 3
    backend = FakeBackend(num_slots=2, window=512, n_batch=256, chunk_rules=ChunkRules(8, 4, exact_reuse=False))
    engine = make_engine(backend, step_tokens=16)
    submit(engine, "batch", "a long batch job", SamplingParams(max_tokens=60, temperature=0))
    engine.step()
    submit(engine, "chat-1", shared + "first ticket", priority=Priority.INTERACTIVE)
    engine.step()  # chat-1 takes the free slot and prefills its long prompt over several steps
    submit(engine, "chat-2", shared + "second ticket", priority=Priority.INTERACTIVE)
    for _ in range(5):
        engine.step()
        assert engine.stats.snapshot().num_preempted == 0, "chat-2 waits for chat-1's prefix, not for a slot"
    results = run_until_done(engine)
    assert results["chat-2"].prompt_tokens_cached > len(shared) // 2, "it reused chat-1's prefix"
