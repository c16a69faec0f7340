"""The life of a sequence: waiting -> prefilling -> decoding -> finished / cancelled / failed,
tested on the Sequence itself, on the engine's phases, and on random interleavings of submit,
step, cancel and cancel_all (hypothesis), on the fake backend."""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fakes import EOS, FakeBackend
from multiseq import CANCELLED_BEFORE_START, Engine, FinishReason, Request, Runner, RunnerConfig, SamplingParams
from multiseq.kv.hostcache import HostEntry
from multiseq.loop.outcome import result_of
from multiseq.sampling.sampler import Sampled, SequenceSampler, sample_rows
from multiseq.loop.sequence import InvalidTransition, SequenceStatus

GREEDY = SamplingParams(max_tokens=4, temperature=0)


def make_engine(backend: FakeBackend) -> Engine:
    config = RunnerConfig(parallel=backend.num_slots, slot_ctx=backend.window, n_batch=backend.n_batch, threads=1,
                          seed=0)
    return Engine(config, backend)


def new_sequence(engine: Engine, prompt: str = "abc", sampling: SamplingParams = GREEDY, request_id: str = "s"):
    return engine.new_sequence(Request(prompt=prompt, sampling=sampling), request_id)


# --- the Sequence on its own ----------------------------------------------------------------

def test_a_sequence_moves_along_its_life_and_nowhere_else():
    engine = make_engine(FakeBackend())
    seq = new_sequence(engine)
    assert seq.status is SequenceStatus.WAITING and not seq.is_running and not seq.is_done
    with pytest.raises(InvalidTransition):
        seq.record_decoded(len(seq.prompt_tokens), True, 0.0)  # a waiting sequence has no slot to decode in
    seq.admit(slot=0, now=0.0)
    assert seq.status is SequenceStatus.PREFILLING and seq.is_running
    with pytest.raises(InvalidTransition):
        seq.admit(slot=1, now=0.0)
    seq.record_decoded(len(seq.prompt_tokens), True, 0.0)
    assert seq.status is SequenceStatus.DECODING
    for token in b"wxyz":
        assert seq.ending is None
        seq.append_token(Sampled(token), bytes([token]), False, 0.0)
    assert seq.ending.reason is FinishReason.LENGTH and seq.status is SequenceStatus.DECODING, \
        "the sequence decided to end; the engine applies it"
    seq.finish(0.0)
    assert seq.status is SequenceStatus.FINISHED and seq.is_done
    with pytest.raises(InvalidTransition):
        seq.finish(0.0)
    assert result_of(seq).text == "wxyz"


def test_a_preempted_sequence_is_parked_and_only_a_parked_one_resumes():
    engine = make_engine(FakeBackend())
    seq = new_sequence(engine, sampling=SamplingParams(max_tokens=8, temperature=0))
    with pytest.raises(AssertionError):
        seq.resume(slot=0)  # a new sequence has no KV to resume from: it is admitted and prefilled
    seq.admit(slot=0, now=0.0)
    seq.record_decoded(len(seq.prompt_tokens), True, 0.0)
    seq.append_token(Sampled(ord("w")), b"w", False, 0.0)
    seq.preempt(HostEntry(seq.prompt_array, b"state"))
    assert seq.status is SequenceStatus.PARKED and seq.is_waiting and not seq.is_running and seq.slot is None
    with pytest.raises(InvalidTransition):
        seq.admit(slot=1, now=0.0)  # a parked sequence goes on from its KV, never from a new prefill
    seq.resume(slot=1)
    assert seq.status is SequenceStatus.DECODING and seq.slot == 1 and seq.parked is None
    seq.request_cancel()
    assert seq.ending.error is None, "a preempted sequence keeps the text it wrote"


def test_finish_needs_an_ending_and_the_first_ending_counts():
    engine = make_engine(FakeBackend())
    seq = new_sequence(engine)
    seq.admit(slot=0, now=0.0)
    with pytest.raises(AssertionError):
        seq.finish(0.0)
    seq.request_cancel()
    seq.fail("later")
    seq.finish(0.0)
    assert seq.status is SequenceStatus.CANCELLED and result_of(seq).error is None


@pytest.mark.parametrize("how, status, reason, error", [
    ("end of generation", SequenceStatus.FINISHED, FinishReason.STOP, None),
    ("stop string", SequenceStatus.FINISHED, FinishReason.STOP, None),
    ("max_tokens", SequenceStatus.FINISHED, FinishReason.LENGTH, None),
    ("full window", SequenceStatus.FINISHED, FinishReason.LENGTH, None),
    ("cancel while waiting", SequenceStatus.CANCELLED, FinishReason.CANCELLED, CANCELLED_BEFORE_START),
    ("cancel while running", SequenceStatus.CANCELLED, FinishReason.CANCELLED, None),
    ("failure", SequenceStatus.FAILED, FinishReason.ERROR, "boom"),
])
def test_each_way_of_ending_gives_its_final_status_and_result(how, status, reason, error):
    engine = make_engine(FakeBackend())
    seq = new_sequence(engine, sampling=SamplingParams(max_tokens=2, temperature=0, stop=("!",)))
    if how == "cancel while waiting":
        seq.request_cancel()
    else:
        seq.admit(slot=0, now=0.0)
        seq.record_decoded(len(seq.prompt_tokens), True, 0.0)
        if how == "end of generation":
            seq.append_token(Sampled(EOS), b"", True, 0.0)
        elif how == "stop string":
            seq.append_token(Sampled(ord("!")), b"!", False, 0.0)
        elif how == "max_tokens":
            for token in b"ab":
                seq.append_token(Sampled(token), bytes([token]), False, 0.0)
        elif how == "full window":
            seq.exhaust_window()
        elif how == "cancel while running":
            seq.request_cancel()
        else:
            seq.fail("boom")
    seq.finish(0.0)
    result = result_of(seq)
    assert (seq.status, result.finish_reason, result.error) == (status, reason, error)
    assert result.truncated == (how == "full window")


# --- the engine's phases --------------------------------------------------------------------

def sequence_state(seq) -> dict:
    """Everything a sequence and its sampler hold, as comparable values."""
    state = {name: copy.deepcopy(value) for name, value in vars(seq).items()
             if name not in ("sampler", "assembler", "_prompt_array", "pieces")}
    state["pieces"] = {name: copy.deepcopy(value) for name, value in vars(seq.pieces).items()
                       if name not in ("assembler", "_lock")}
    state["sampler"] = {name: copy.deepcopy(value) for name, value in vars(seq.sampler).items()
                        if name not in ("token_bytes", "constraint", "banned", "bias_ids", "bias_values")}
    state["assembler"] = (seq.pieces.assembler._stops.held,)
    return state


def test_execute_computes_and_changes_no_sequence_update_applies_it():
    """execute() runs without the runner's lock: it must only compute. Everything it found
    (tokens, logprobs) comes back as plain data, and update() is where sequences change."""
    engine = make_engine(FakeBackend(num_slots=3, noisy=True))
    sampling = [SamplingParams(max_tokens=6, temperature=0.9, logprobs=True, top_logprobs=3),
                SamplingParams(max_tokens=6, temperature=0, presence_penalty=1.0),
                SamplingParams(max_tokens=6, temperature=0.7, json_object=True)]
    for index, params in enumerate(sampling):
        engine.add(new_sequence(engine, f"prompt {index}", params, f"r{index}"))
    engine.step()
    plan = engine.schedule()
    seqs = [chunk.seq for chunk in plan.chunks]
    before = [sequence_state(seq) for seq in seqs]
    executed = engine.execute(plan)
    assert [sequence_state(seq) for seq in seqs] == before
    assert len(executed.sampled) == 3 and executed.sampled[0].logprob is not None
    assert all(isinstance(sampled, Sampled) for sampled in executed.sampled)
    engine.update(executed)
    assert [seq.output_tokens[-1] for seq in seqs] == [sampled.token for sampled in executed.sampled]
    assert seqs[0].pieces.logprobs[-1] == executed.sampled[0].logprob


def test_a_draw_depends_only_on_the_seed_and_the_tokens_index():
    """Sampling the same row twice before accepting gives the same token (nothing was used
    up), and a sampler that accepted the same tokens as another draws alike: a sequence
    computed again from its tokens samples what it sampled the first time."""
    logits = np.random.default_rng(0).normal(0, 1, (1, 512)).astype(np.float32)
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    first, second = (SequenceSampler(params, seed=7, prompt_tokens=[]) for _ in range(2))
    tokens = []
    for _ in range(20):
        draws = {sample_rows(logits.copy(), [first])[0].token for _ in range(3)}
        assert len(draws) == 1
        tokens.append(draws.pop())
        first.accept(tokens[-1])
    assert len(set(tokens)) > 5, "successive draws differ"
    for token in tokens:
        second.accept(token)
    assert sample_rows(logits.copy(), [second]) == sample_rows(logits.copy(), [first])


# --- random interleavings -----------------------------------------------------------------

PROMPTS = st.text(alphabet="abcdefgh ", min_size=1, max_size=30)


class RunnerLife(RuleBasedStateMachine):
    """Any order of submit, cancel and cancel_all from the test's thread, against the worker
    stepping on its own, some cancels landing while it decodes: every request ends exactly
    once, with the status its history calls for; nothing is streamed for it after it ended or
    after its cancel returned; the slots end empty but for reusable prompts."""

    def __init__(self) -> None:
        super().__init__()
        self.backend = FakeBackend(num_slots=3, window=64, n_batch=24, decode_delay=0.0005)
        config = RunnerConfig(parallel=3, slot_ctx=64, n_batch=24, threads=1, seed=0)
        self.runner = Runner(config, backend=self.backend)
        self.handles = {}
        self.pieces: dict[str, list[str]] = {}
        self.cancelled_at: dict[str, int] = {}  # request id -> pieces streamed when cancel() returned
        self.finished: dict[str, int] = {}  # request id -> times its result arrived

    def _on_finish(self, result) -> None:
        self.finished[result.id] = self.finished.get(result.id, 0) + 1

    @rule(prompt=PROMPTS, max_tokens=st.integers(1, 12), stop=st.sampled_from([(), ("c",), ("ab",)]))
    def submit(self, prompt, max_tokens, stop):
        request_id = f"r{len(self.handles)}"
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0, stop=stop)
        self.pieces[request_id] = []
        self.handles[request_id] = self.runner.submit(Request(prompt=prompt, id=request_id, sampling=sampling),
                                                      stream=True, on_finish=self._on_finish)

    @rule()
    def wait_for_the_step_under_way(self):
        self.runner.between_steps(lambda: None)
        self._collect()

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def cancel(self, data):
        self._cancel(data.draw(st.sampled_from(sorted(self.handles))))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def cancel_while_the_worker_decodes(self, data):
        """What a client's thread may do while the worker is inside llama_decode (when it has
        something to decode): the cancel is posted then, and answered once the step ends."""
        request_id = data.draw(st.sampled_from(sorted(self.handles)))
        decoding, go_on = threading.Event(), threading.Event()
        self.backend.during_decode = lambda: (decoding.set(), go_on.wait(5))
        decoding.wait(0.02)
        canceller = threading.Thread(target=self._cancel, args=(request_id,))
        canceller.start()
        time.sleep(0.002)  # the cancel is posted meanwhile
        self.backend.during_decode = None
        go_on.set()
        canceller.join(5)

    @rule()
    def cancel_all(self):
        self.runner.cancel_all()
        self._collect()
        for request_id in self.handles:
            self.cancelled_at.setdefault(request_id, len(self.pieces[request_id]))

    def _cancel(self, request_id: str) -> None:
        self.runner.cancel(request_id)
        self._collect()
        self.cancelled_at.setdefault(request_id, len(self.pieces[request_id]))

    def _collect(self) -> None:
        for request_id, handle in self.handles.items():
            queue = handle._pieces
            while not queue.empty():
                piece = queue.get_nowait()
                if isinstance(piece, str):
                    self.pieces[request_id].append(piece)

    @invariant()
    def nothing_is_streamed_after_a_cancel_returned(self):
        self._collect()
        for request_id, count in self.cancelled_at.items():
            assert len(self.pieces[request_id]) == count, f"{request_id} streamed after cancel()"

    @invariant()
    def a_result_arrives_at_most_once(self):
        assert all(count == 1 for count in self.finished.values())

    @invariant()
    def the_waiting_count_is_never_below_zero(self):
        assert self.runner.num_waiting >= 0

    def teardown(self):
        results = {request_id: handle.result(timeout=10) for request_id, handle in self.handles.items()}
        assert self.runner.num_waiting == 0, "every request ended: none is counted as waiting"
        self.runner.between_steps(lambda: self.backend.assert_free_slots_hold_only_kept_prompts(
            self.runner.engine.scheduler))
        self.runner.close()
        self._collect()
        assert not self.runner.engine.has_work
        for request_id, result in results.items():
            assert self.finished[request_id] == 1
            assert "".join(self.pieces[request_id]) == result.text, "the stream is the result's text"
            assert "internal error" not in (result.error or ""), result.error
            if request_id in self.cancelled_at:
                assert result.finish_reason in (FinishReason.CANCELLED, FinishReason.STOP, FinishReason.LENGTH)
                if result.error == CANCELLED_BEFORE_START:
                    assert result.text == "" and result.completion_tokens == 0
            else:
                assert result.ok, result


TestRunnerLife = RunnerLife.TestCase
TestRunnerLife.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])
