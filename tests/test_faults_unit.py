"""One request's fault stays one request's: an exception while one request is sampled,
constrained, detokenized, parsed, finished, reported or delivered, or a decode that fails for its
tokens, fails that request alone, with an error naming the stage; the seven requests beside it
finish with the text they have without the fault, and every slot is free afterwards. A failure
that is no one request's (a backend that fails every decode) stops the engine, and says so."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from fakes import FakeBackend
from multiseq import FinishReason, Request, SamplingParams
from multiseq.loop.execution import MAX_FAILED_DECODES_IN_A_ROW
from multiseq.errors import BackendError, NoKvSlot
from multiseq.server import ServerSettings, create_app
from multiseq.loop.sequence import Sequence
from multiseq.tools import ToolFormat, output_parser

NUM_REQUESTS = 8
FAULTY = "r3"
POISON = 7  # a byte only the faulty request's prompt holds (for the decode faults)
BIAS_TOKEN = ord("Z")
# Applied once, this bias leaves the greedy token alone (the fake's peak is 20); applied twice it
# would win: a row sampled again after a failed batch must not be adjusted twice.
BIAS = 12.0


class InjectedFault(Exception):
    pass


def injected(*args, **kwargs):
    raise InjectedFault("injected fault")


def prompt_of(request_id: str) -> str:
    return f"prompt {request_id}" + ("\x07" if request_id == FAULTY else "")


def requests(max_tokens: int = 12) -> list[Request]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0, logit_bias={BIAS_TOKEN: BIAS},
                              presence_penalty=0.5)
    return [Request(prompt=prompt_of(f"r{index}"), sampling=sampling, id=f"r{index}")
            for index in range(NUM_REQUESTS)]


def run_eight(make_runner, inject=None, backend: FakeBackend | None = None, callbacks: dict | None = None):
    """The eight requests at once on eight slots, `inject(seq)` applied to the faulty request's
    sequence as it is made, `callbacks` (by id) given to submit(); the results by id, and the
    runner (its slots checked free)."""
    backend = backend or FakeBackend(num_slots=NUM_REQUESTS, window=128, n_batch=256)
    runner = make_runner(backend, autostart=False)
    if inject is not None:
        new_sequence = runner.engine.maker.new_sequence

        def tampered(request: Request, request_id: str, **options) -> Sequence:
            seq = new_sequence(request, request_id, **options)
            if request_id == FAULTY:
                inject(seq)
            return seq

        runner.engine.maker.new_sequence = tampered
    handles = [runner.submit(request, **(callbacks or {}).get(request.id, {})) for request in requests()]
    runner.start()
    results = {handle.id: handle.result(timeout=30) for handle in handles}
    runner.close()
    backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)
    return results, runner


@pytest.fixture
def baseline(make_runner):
    results, _ = run_eight(make_runner)
    assert all(result.ok and len(result.text) == 12 for result in results.values())
    return {request_id: result.text for request_id, result in results.items()}


def assert_only_the_faulty_one_failed(results, baseline, stage: str) -> None:
    faulty = results[FAULTY]
    assert faulty.finish_reason is FinishReason.ERROR and stage in faulty.error, faulty.error
    assert "Traceback" not in faulty.error
    for request_id, result in results.items():
        if request_id != FAULTY:
            assert result.ok, f"{request_id} failed beside the faulty request: {result.error}"
            assert result.text == baseline[request_id], f"{request_id} changed beside the faulty request"


# --- sampling and constraining -------------------------------------------------------------------

def raising_adjust(seq: Sequence) -> None:
    seq.sampler.adjust = injected


def raising_grammar_mask(seq: Sequence) -> None:
    seq.sampler.constraint = RaisingConstraint()


class RaisingConstraint:
    """A constraint whose matcher cannot even be asked for a mask."""

    approximated = ()
    is_complete = False

    @property
    def matcher(self):
        raise InjectedFault("injected grammar fault")


def raising_grammar_accept(seq: Sequence) -> None:
    seq.sampler.accept = injected


def raising_detokenizer(seq: Sequence) -> None:
    seq.pieces.assembler.feed = injected


@pytest.mark.parametrize("inject, stage", [
    (raising_adjust, "while sampling"),
    (raising_grammar_mask, "while sampling"),
    (raising_grammar_accept, "while constraining its output"),
    (raising_detokenizer, "while detokenizing its output"),
], ids=["sampler row", "grammar mask", "grammar accept", "detokenizer"])
def test_a_fault_while_one_request_is_sampled_or_its_token_taken_fails_it_alone(make_runner, baseline, inject, stage):
    results, _ = run_eight(make_runner, inject)
    assert_only_the_faulty_one_failed(results, baseline, stage)


def test_a_failed_batched_sampling_samples_every_other_row_as_it_would_have(make_runner, baseline):
    """The rows adjusted before the faulty one raised are put back before they are sampled
    again one by one: their bias counts once (twice, it would pick BIAS_TOKEN)."""
    results, _ = run_eight(make_runner, raising_adjust)
    assert not any(chr(BIAS_TOKEN) in results[f"r{index}"].text for index in range(NUM_REQUESTS))
    assert_only_the_faulty_one_failed(results, baseline, "while sampling")


# --- parsing, finishing, reporting -----------------------------------------------------------------

def call_id(index: int) -> str:
    return f"call_{index}"


def with_parser(method: str):
    def inject(seq: Sequence) -> None:
        parser = output_parser(ToolFormat.GENERIC, call_id=call_id)
        setattr(parser, method, injected)
        seq.pieces.tool_parser = parser
    return inject


@pytest.mark.parametrize("method, stage", [
    ("feed", "while parsing its output"),
    ("close", "while parsing its output"),
    ("result", "while parsing its output"),
])
def test_a_tool_parser_that_raises_fails_its_request_alone_and_frees_its_slot(make_runner, baseline, method, stage):
    results, _ = run_eight(make_runner, with_parser(method))
    assert_only_the_faulty_one_failed(results, baseline, stage)


def test_a_fault_while_a_sequence_is_finished_fails_it_and_still_frees_its_slot(make_runner, baseline):
    def raising_flush(seq: Sequence) -> None:
        seq.pieces.assembler.flush = injected

    results, _ = run_eight(make_runner, raising_flush)
    assert_only_the_faulty_one_failed(results, baseline, "while finishing its output")


# --- delivery ------------------------------------------------------------------------------------

def test_an_on_piece_callback_that_raises_fails_its_request_alone(make_runner, baseline):
    results, _ = run_eight(make_runner, callbacks={FAULTY: {"on_piece": injected}})
    assert_only_the_faulty_one_failed(results, baseline, "while delivering its output")


def test_an_on_finish_callback_that_raises_leaves_its_result_and_every_other_request(make_runner, baseline):
    results, _ = run_eight(make_runner, callbacks={FAULTY: {"on_finish": injected}})
    assert {request_id: result.text for request_id, result in results.items()} == baseline
    assert all(result.ok for result in results.values())


def test_a_streamed_request_whose_callback_raises_ends_its_stream(make_runner, baseline):
    backend = FakeBackend(num_slots=NUM_REQUESTS, window=128, n_batch=256)
    runner = make_runner(backend, autostart=False)
    handles = [runner.submit(request, stream=True, on_piece=injected if request.id == FAULTY else None)
               for request in requests()]
    runner.start()
    texts = {handle.id: "".join(handle) for handle in handles}  # every stream ends
    assert {request_id: text for request_id, text in texts.items() if request_id != FAULTY} == \
        {request_id: text for request_id, text in baseline.items() if request_id != FAULTY}
    assert "while delivering" in handles[3].result(timeout=5).error


# --- llama_decode ------------------------------------------------------------------------------

@pytest.mark.parametrize("error, words", [(BackendError, "llama_decode failed"), (NoKvSlot, "no KV")],
                         ids=["decode error", "no KV slot"])
def test_a_decode_that_fails_for_one_request_fails_it_alone(make_runner, baseline, error, words):
    backend = FakeBackend(num_slots=NUM_REQUESTS, window=128, n_batch=256)
    backend.poison_token, backend.poison_error = POISON, error
    results, runner = run_eight(make_runner, backend=backend)
    assert_only_the_faulty_one_failed(results, baseline, words)
    assert runner.failure is None, "one request's failed decode does not stop the engine"


def test_a_backend_that_fails_every_decode_stops_the_engine_and_says_why(make_runner):
    backend = FakeBackend(num_slots=NUM_REQUESTS, window=128, n_batch=256)
    backend.fail_every_decode = True
    runner = make_runner(backend, autostart=False)
    handles = [runner.submit(request) for request in requests()]
    runner.start()
    results = [handle.result(timeout=30) for handle in handles]
    assert all(result.finish_reason is FinishReason.ERROR and "the engine stopped" in result.error
               and "llama_decode" in result.error for result in results)
    assert runner.failure is not None and "llama_decode" in runner.failure
    later = runner.submit(Request(prompt="after", sampling=SamplingParams(max_tokens=2)))
    assert "the engine stopped" in later.result(timeout=5).error, "a request after the failure ends at once"
    with pytest.raises(RuntimeError, match="the engine stopped"):
        runner.clear_prefix_cache()  # work for the stepping thread is refused, not left waiting


def test_a_read_or_cancel_waiting_when_the_engine_stops_still_answers(make_runner):
    """stats(), snapshot(), cancel() and close() are answered after a stop, even when they were
    waiting for the step that failed: they read an engine that no longer changes."""
    backend = FakeBackend(num_slots=NUM_REQUESTS, window=128, n_batch=256)
    backend.fail_every_decode = True
    decoding, posted = threading.Event(), threading.Event()
    backend.during_decode = lambda: (decoding.set(), posted.wait(5))
    runner = make_runner(backend, autostart=False)
    handles = [runner.submit(request) for request in requests()]
    runner.start()
    assert decoding.wait(5)
    answers: list = []
    reader = threading.Thread(target=lambda: answers.append(_outcome(runner.stats)))
    reader.start()
    time.sleep(0.2)  # the read is posted while the failing step decodes
    posted.set()
    reader.join(10)
    assert all("the engine stopped" in handle.result(timeout=5).error for handle in handles)
    assert len(answers) == 1 and not isinstance(answers[0], BaseException), answers
    runner.close()


def _outcome(call):
    try:
        return call()
    except BaseException as error:  # noqa: BLE001 - what the test looks at
        return error


def test_a_single_request_whose_decodes_keep_failing_fails_without_stopping_the_engine(make_runner):
    backend = FakeBackend(num_slots=2, window=128, n_batch=256)
    backend.poison_token = POISON
    runner = make_runner(backend)
    faulty = runner.submit(Request(prompt=prompt_of(FAULTY), sampling=SamplingParams(max_tokens=4)))
    assert "llama_decode failed" in faulty.result(timeout=10).error
    fine = runner.submit(Request(prompt="fine", sampling=SamplingParams(max_tokens=4, temperature=0)))
    assert fine.result(timeout=10).ok and runner.failure is None


def test_a_bug_outside_any_request_stops_the_engine_instead_of_looping(make_runner):
    backend = FakeBackend(num_slots=2, window=128, n_batch=256)
    runner = make_runner(backend, autostart=False)
    runner.engine.scheduler.plan = injected
    handle = runner.submit(Request(prompt="x", sampling=SamplingParams(max_tokens=2)))
    runner.start()
    result = handle.result(timeout=10)
    assert result.error == "the engine stopped: internal error (InjectedFault; the log has its traceback)"
    assert runner.failure == "internal error (InjectedFault; the log has its traceback)"


# --- the server ----------------------------------------------------------------------------------

def get(base: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_over_http_the_faulty_request_gets_a_500_and_the_others_their_answers(make_runner, serve_app):
    backend = FakeBackend(num_slots=NUM_REQUESTS, window=128, n_batch=256)
    backend.poison_token = POISON
    base = serve_app(create_app(make_runner(backend), ServerSettings(model_name="fake")))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

    def complete(request_id: str, stream: bool):
        try:
            if stream:
                return "".join(chunk.choices[0].text for chunk in client.completions.create(
                    model="fake", prompt=prompt_of(request_id), max_tokens=6, temperature=0, stream=True))
            return client.completions.create(model="fake", prompt=prompt_of(request_id), max_tokens=6,
                                             temperature=0).choices[0].text
        except openai.APIError as error:
            return error

    with ThreadPoolExecutor(NUM_REQUESTS) as pool:
        answers = dict(zip([(f"r{i}", stream) for i in range(NUM_REQUESTS) for stream in (False, True)],
                           pool.map(lambda key: complete(*key), [(f"r{i}", stream) for i in range(NUM_REQUESTS)
                                                                   for stream in (False, True)])))
    for (request_id, stream), answer in answers.items():
        if request_id == FAULTY:
            assert isinstance(answer, openai.APIError), answer
            assert "Traceback" not in str(answer) and "llama_decode" not in str(answer), "no internals reach a client"
            if not stream:
                assert answer.status_code == 500
        else:
            assert isinstance(answer, str) and len(answer) == 6, (request_id, stream, answer)
    assert get(base, "/health")[0] == 200, "one request's fault leaves the server healthy"


def test_after_an_engine_failure_health_and_metrics_say_so_and_requests_get_a_503(make_runner, serve_app):
    backend = FakeBackend(num_slots=2, window=128, n_batch=256)
    backend.fail_every_decode = True
    runner = make_runner(backend)
    base = serve_app(create_app(runner, ServerSettings(model_name="fake")))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    assert "multiseq_engine_failed 0.0" in get(base, "/metrics")[1].decode()
    for attempt in range(MAX_FAILED_DECODES_IN_A_ROW):  # one request at a time: each might have been at fault
        with pytest.raises(openai.InternalServerError):
            client.completions.create(model="fake", prompt=f"x{attempt}", max_tokens=2)
    status, body = get(base, "/health")
    assert status == 503 and json.loads(body) == {"status": "failed", "reason": runner.failure}
    assert "llama_decode" in runner.failure
    assert "multiseq_engine_failed 1.0" in get(base, "/metrics")[1].decode()
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model="fake", prompt="y", max_tokens=2)
    assert refused.value.status_code == 503 and "engine stopped" in str(refused.value)


# --- batch-run ---------------------------------------------------------------------------------

def test_batch_run_after_an_engine_failure_exits_non_zero_and_resume_finishes_the_file(fake_job, read_jsonl,
                                                                                        tmp_path, capsys):
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"line{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(40)))
    broken = FakeBackend(num_slots=4, window=64, n_batch=64)
    broken.fail_decodes_after = 3  # four lines decode together, then every decode fails
    assert fake_job(prompts, out, backend=broken) == 1
    written = read_jsonl(out)
    # How many lines share the first failing decode depends on how fast the reader feeds them
    # (a busy machine: fewer): the ones that failed alone before the engine was judged at fault
    # say their decode failed; the rest, that the engine stopped.
    errors = [line["error"] for line in written if line["error"]]
    assert any("the engine stopped" in error for error in errors)
    assert all("the engine stopped" in error or "llama_decode failed" in error for error in errors), errors
    assert len(written) < 40, "lines read after the failure are not run (nor written)"
    assert "not started (--resume runs them and the failed ones)" in capsys.readouterr().err
    assert fake_job(prompts, out, resume=True) == 0
    assert sorted(line["id"] for line in read_jsonl(out) if line["error"] is None) == sorted(f"line{i}" for i in range(40))
