"""The thread-free Engine, driven directly: step() says what happened, aborts are exact."""

from __future__ import annotations

from fakes import FakeBackend
from multiseq import CANCELLED_BEFORE_START, Engine, FinishReason, Request, RunnerConfig, SamplingParams


def make_engine(backend: FakeBackend) -> Engine:
    config = RunnerConfig(parallel=backend.num_slots, slot_ctx=backend.window, n_batch=backend.n_batch, threads=1,
                          seed=0)
    return Engine(config, backend)


def add(engine: Engine, request_id: str, prompt: str, max_tokens: int = 5) -> None:
    request = Request(prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0))
    engine.add(engine.new_sequence(request, request_id))


def test_step_returns_the_pieces_and_results_it_produced():
    engine = make_engine(FakeBackend(num_slots=2, replies={"q": "hi!"}))
    assert not engine.step(), "an idle engine does nothing"
    add(engine, "a", "q")
    outputs = []
    while engine.has_work:
        outputs.append(engine.step())
    assert "".join(piece.text for output in outputs for piece in output.pieces) == "hi!"
    assert all(piece.request_id == "a" for output in outputs for piece in output.pieces)
    [result] = [result for output in outputs for result in output.finished]
    assert (result.id, result.text, result.finish_reason) == ("a", "hi!", FinishReason.STOP)
    assert outputs[-1].finished == [result], "the result comes in the step that ended it"


def test_aborting_a_waiting_request_ends_it_at_once_without_running_it():
    backend = FakeBackend(num_slots=1)
    engine = make_engine(backend)
    add(engine, "running", "first")
    add(engine, "waiting", "second")
    engine.step()
    assert engine.abort("waiting") and not engine.abort("unknown")
    [result] = engine.take_output().finished
    assert result.id == "waiting" and result.error == CANCELLED_BEFORE_START
    while engine.has_work:
        engine.step()
    assert sum(is_prefill for call in backend.calls for _, _, is_prefill in call.entries) == 1


def test_an_abort_during_the_decode_drops_that_step_token():
    backend = FakeBackend(num_slots=2)
    engine = make_engine(backend)
    add(engine, "kept", "aaa", max_tokens=10)
    add(engine, "cut", "bbb", max_tokens=10)
    engine.step()
    engine.take_output()
    plan = engine.schedule()
    executed = engine.execute(plan)  # the Runner runs this without its lock: a cancel may land now
    engine.abort("cut")
    engine.update(executed)
    output = engine.take_output()
    assert [piece.request_id for piece in output.pieces] == ["kept"], "nothing emitted for the aborted request"
    [result] = output.finished
    assert result.id == "cut" and result.finish_reason is FinishReason.CANCELLED and result.completion_tokens == 1
    # Its token went into the KV in the step that ran while it was cancelled: kept for reuse.
    assert backend.kv[1] == backend.tokenize("bbb") + list(result.text.encode()) and engine.scheduler.slots[1].is_free
    assert engine.scheduler.slots[1].kept.tolist() == backend.kv[1]


def test_abort_all_ends_waiting_requests_now_and_running_ones_at_the_next_step():
    backend = FakeBackend(num_slots=2)
    engine = make_engine(backend)
    for index in range(5):
        add(engine, f"r{index}", f"prompt {index}", max_tokens=20)
    engine.step()
    engine.take_output()
    assert engine.abort_all() == 5
    drained = engine.take_output().finished
    assert [r.id for r in drained] == ["r2", "r3", "r4"] and all(r.error == CANCELLED_BEFORE_START for r in drained)
    stopped = engine.step()
    assert [r.id for r in stopped.finished] == ["r0", "r1"] and not stopped.pieces
    assert all(r.finish_reason is FinishReason.CANCELLED and r.error is None for r in stopped.finished)
    assert not engine.has_work and len(backend.calls) == 1, "nothing was decoded after abort_all"
