"""Constraints, logprobs, penalties and logit bias through the runner, on the fake backend."""

from __future__ import annotations

import json
from collections import deque

import jsonschema
import numpy as np
import pytest

from fakes import EOS, FakeBackend
from multiseq import FinishReason, Request, SamplingParams
from multiseq.sampling.sampler import SequenceSampler, apply_penalties, sample_rows

LABEL_SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["spam", "ham"]}, "score": {"type": "integer"}},
    "required": ["label", "score"],
    "additionalProperties": False,
}


def run(make_runner, requests, **backend):
    runner = make_runner(FakeBackend(**backend))
    try:
        return runner.run_batch(requests)
    finally:
        runner.close()


def test_schema_constrained_outputs_that_end_by_themselves_validate(make_runner):
    requests = [Request(prompt=f"item {index}", sampling=SamplingParams(max_tokens=80, temperature=1.0,
                                                                         json_schema=LABEL_SCHEMA, seed=index))
                for index in range(12)]
    results = run(make_runner, requests, noisy=True)
    ended = [result for result in results if result.finish_reason is FinishReason.STOP]
    assert len(ended) >= 8, [result.text for result in results]
    for result in ended:
        jsonschema.validate(json.loads(result.text), LABEL_SCHEMA)


def test_a_constraint_overrides_what_the_model_wants_to_write(make_runner):
    """The fake's script says 'maybe'; the grammar allows yes or no, both at logit 0: greedy
    takes the lower id, 'n', and the output ends with the document."""
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(
        temperature=0, grammar='root ::= "yes" | "no"'))], replies={"q": "maybe"})
    assert (result.text, result.finish_reason) == ("no", FinishReason.STOP)


def test_at_max_tokens_the_output_is_a_prefix_of_a_valid_document(make_runner):
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(
        temperature=0, max_tokens=3, grammar='root ::= "alpha" | "beta"'))])
    assert result.finish_reason is FinishReason.LENGTH and "alpha".startswith(result.text) and len(result.text) == 3


def test_json_object_mode_gives_an_object(make_runner):
    requests = [Request(prompt=f"item {index}", sampling=SamplingParams(max_tokens=60, temperature=1.0,
                                                                         json_object=True, seed=index))
                for index in range(12)]
    results = run(make_runner, requests, noisy=True)
    ended = [result for result in results if result.finish_reason is FinishReason.STOP]
    assert len(ended) >= 6, [result.text for result in results]
    assert all(isinstance(json.loads(result.text), dict) for result in ended)


@pytest.mark.parametrize("sampling, message", [
    (dict(grammar='root ::= "yes" | "no'), "grammar cannot be compiled"),
    (dict(json_schema={"type": "objectx"}), "json_schema cannot be compiled"),
    (dict(logit_bias={600: 1.0}), "logit_bias names token 600"),
])
def test_a_request_that_cannot_be_honoured_fails_before_it_runs(make_runner, sampling, message):
    backend = FakeBackend()
    runner = make_runner(backend)
    [bad, good] = runner.run_batch([Request(prompt="a", sampling=SamplingParams(**sampling)),
                                    Request(prompt="b", sampling=SamplingParams(max_tokens=2))])
    runner.close()
    assert bad.finish_reason is FinishReason.ERROR and message in bad.error and bad.is_invalid_request
    # Only the good request ran: its prompt (BOS and one byte), then its first token fed back.
    assert good.ok and sum(call.num_tokens for call in backend.calls) == 2 + 1


def test_constrained_and_free_requests_batched_give_what_they_give_alone(make_runner):
    def requests():
        return [Request(prompt=f"p{index}", id=f"r{index}", sampling=SamplingParams(
            max_tokens=40, temperature=0.9, seed=index, json_schema=LABEL_SCHEMA if index % 2 else None))
            for index in range(6)]

    batched = run(make_runner, requests(), noisy=True, num_slots=4)
    alone = [run(make_runner, [request], noisy=True, num_slots=1)[0] for request in requests()]
    assert [r.text for r in batched] == [r.text for r in alone]


def test_logprobs_of_a_greedy_token_are_the_rows_max_and_top_logprobs_add_up(make_runner):
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(
        temperature=0, max_tokens=5, logprobs=True, top_logprobs=20))], noisy=True)
    assert len(result.logprobs) == 5
    for entry in result.logprobs:
        assert entry.top_logprobs[0].token_id == entry.token_id
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob) and entry.logprob < 0
        logprobs = [top.logprob for top in entry.top_logprobs]
        assert logprobs == sorted(logprobs, reverse=True) and len(logprobs) == 20
        assert 0.2 < np.exp(logprobs).sum() <= 1.0 + 1e-9


def test_logprobs_are_taken_before_bias_and_masks():
    logits = np.log(np.array([[0.5, 0.25, 0.25] + [1e-12] * 509], dtype=np.float32))
    params = SamplingParams(temperature=0, logprobs=True, top_logprobs=2, logit_bias={1: 50.0})
    sampler = SequenceSampler(params, seed=0, prompt_tokens=[])
    [sampled] = sample_rows(logits.copy(), [sampler])
    assert sampled.token == 1
    assert sampled.logprob.logprob == pytest.approx(np.log(0.25), abs=1e-5)
    assert [top.token_id for top in sampled.logprob.top_logprobs] in ([0, 1], [0, 2])


def test_logprobs_follow_the_output_tokens(make_runner):
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(
        temperature=0, logprobs=True))], replies={"q": "héllo"})
    assert b"".join(entry.token_bytes for entry in result.logprobs).decode() == result.text == "héllo"
    assert [entry.text for entry in result.logprobs][1:3] == ["\\xc3", "\\xa9"], "split characters as \\xNN"


def test_no_logprobs_unless_asked(make_runner):
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(max_tokens=3))])
    assert result.logprobs is None


def test_end_of_generation_has_no_logprob_entry(make_runner):
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(
        temperature=0, logprobs=True))], replies={"q": "ab"})
    assert result.completion_tokens == 3 and [entry.token_id for entry in result.logprobs] == [ord("a"), ord("b")]


def test_penalties_follow_llama_cpp():
    """logit <- logit / repeat (or * repeat when <= 0), then - count * frequency - presence."""
    row = np.array([2.0, -2.0, 1.0, 4.0], dtype=np.float32)
    params = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    apply_penalties(row, deque([0, 1, 1]), params)
    np.testing.assert_allclose(row, [2.0 / 2 - 0.5 - 0.25, -2.0 * 2 - 1.0 - 0.25, 1.0, 4.0])


def test_presence_and_frequency_penalties_reach_the_sampler_with_the_prompt_window():
    logits = np.zeros((2, 512), dtype=np.float32)
    logits[:, 7] = 1.0
    plain = SequenceSampler(SamplingParams(temperature=0), seed=0, prompt_tokens=[7])
    penalized = SequenceSampler(SamplingParams(temperature=0, presence_penalty=1.5), seed=0, prompt_tokens=[7])
    assert [sampled.token for sampled in sample_rows(logits.copy(), [plain, penalized])] == [7, 0]


def test_logit_bias_pushes_and_bans_tokens(make_runner):
    [pushed, banned] = run(make_runner, [
        Request(prompt="q", sampling=SamplingParams(temperature=0, max_tokens=3, logit_bias={ord("z"): 100})),
        Request(prompt="q", sampling=SamplingParams(temperature=0, max_tokens=2, logit_bias={ord("h"): -100})),
    ], replies={"q": "hi"})
    assert pushed.text == "zzz"
    assert not banned.text.startswith("h")


def test_ignore_eos_with_a_finished_document_ends_as_stop(make_runner):
    [result] = run(make_runner, [Request(prompt="q", sampling=SamplingParams(
        temperature=0, ignore_eos=True, max_tokens=20, grammar='root ::= "ok"'))])
    assert (result.text, result.finish_reason) == ("ok", FinishReason.STOP)


def test_sampling_params_name_the_bad_field():
    for fields, message in [
        (dict(json_schema={}, grammar="root ::= \"a\""), "at most one of json_schema, grammar"),
        (dict(top_logprobs=3), "top_logprobs needs logprobs=True"),
        (dict(logprobs=True, top_logprobs=21), "top_logprobs must be an integer in [0, 20]"),
        (dict(presence_penalty=2.5), "presence_penalty must be a number in [-2, 2]"),
        (dict(logit_bias={"5": 1}), "logit_bias keys must be token ids"),
        (dict(logit_bias={5: 101}), "logit_bias of token 5 must be a number in [-100, 100]"),
        (dict(json_schema="{}"), "json_schema must be a JSON Schema object"),
    ]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            SamplingParams(**fields)
    assert EOS == 257


def test_streamed_pieces_carry_their_tokens_logprobs_in_order(make_runner):
    """on_piece hands out each piece with the logprobs of the tokens behind it; text held back
    (a possible stop string's start) brings its tokens' logprobs with the piece that releases
    it; with what the result holds beyond the pieces, they are the result's logprobs."""
    pieces = []
    backend = FakeBackend(num_slots=2, replies={"q": "ab#c#d"})
    with make_runner(backend) as runner:
        handle = runner.submit(Request(prompt="q", sampling=SamplingParams(temperature=0, logprobs=True, stop=("#d",))),
                               on_piece=pieces.append)
        result = handle.result(timeout=10)
    assert "".join(piece.text for piece in pieces) == result.text == "ab#c"
    streamed = [entry for piece in pieces for entry in piece.logprobs]
    assert [entry.token_id for entry in streamed] == [ord(c) for c in "ab#c"]
    assert streamed == list(result.logprobs[:len(streamed)])
    assert [entry.token_id for entry in result.logprobs[len(streamed):]] == [ord("#"), ord("d")]
