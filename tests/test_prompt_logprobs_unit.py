"""Prompt log probabilities (echo with logprobs, what evaluation harnesses score with), on the
fake backend: every prompt token after the first gets the log-softmax of the row before it, in
whatever chunks the prompt is cut, beside whatever else runs, never from a cached prefix (a
cache keeps KV, not rows); other sequences' text does not change."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import BOS, EOS, FakeBackend
from multiseq import Request, SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog"


def reference_logprobs(tokens: list[int]) -> list[float]:
    """What the fake's rows say each token after the first has: its row computed alone from
    the context before it."""
    reference = FakeBackend(noisy=True)
    values = []
    for index in range(1, len(tokens)):
        reference.kv[0] = list(tokens[:index])
        reference.prompts[0] = list(tokens[:index])
        row = reference._logits(0).astype(np.float64)
        values.append(float(row[tokens[index]] - (row.max() + np.log(np.exp(row - row.max()).sum()))))
    return values


def scored(prompt=PROMPT, top=2, max_tokens=1, **sampling) -> Request:
    return Request(prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=True,
                                                          prompt_logprobs=top, **sampling))


def test_every_prompt_token_after_the_first_gets_the_log_probability_of_the_row_before_it(make_runner):
    backend = FakeBackend(noisy=True)
    [result] = make_runner(backend).run_batch([scored()])
    tokens = [BOS, *PROMPT.encode()]
    assert result.ok and result.prompt_token_ids == tuple(tokens)
    assert [entry.token_id for entry in result.prompt_logprobs] == tokens[1:]
    assert np.allclose([entry.logprob for entry in result.prompt_logprobs], reference_logprobs(tokens), atol=1e-5)
    for entry in result.prompt_logprobs:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob <= entry.top_logprobs[0].logprob
    assert result.completion_tokens == 1 and len(result.logprobs) == 1, "the generated token as always"


def test_scores_are_the_same_in_any_chunks_beside_any_work_and_after_the_prompt_was_cached(make_runner):
    whole = make_runner(FakeBackend(noisy=True)).run_batch([scored()])[0]
    # Cut into chunks of a few tokens, beside three sequences decoding, after the same prompt
    # was computed (and kept) for an unscored request.
    backend = FakeBackend(noisy=True, n_batch=16)
    runner = make_runner(backend, step_tokens=8)
    plain = Request(prompt=PROMPT, sampling=SamplingParams(max_tokens=2, temperature=0))
    runner.run_batch([plain])
    others = [Request(prompt=f"other {index}", sampling=SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
              for index in range(3)]
    alone = make_runner(FakeBackend(noisy=True)).run_batch(others)
    results = runner.run_batch([*others, scored()])
    chunked = results[-1]
    assert chunked.prompt_tokens_cached == 0, "a scored prompt is computed whole"
    assert [entry.logprob for entry in chunked.prompt_logprobs] == [entry.logprob for entry in whole.prompt_logprobs]
    assert [entry.top_logprobs for entry in chunked.prompt_logprobs] == [entry.top_logprobs for entry in whole.prompt_logprobs]
    assert [result.text for result in results[:-1]] == [result.text for result in alone], "the others are exact"
    assert max(len(call.entries) for call in backend.calls) > 1, "the scored chunks ran beside the others"


def test_a_kv_too_full_for_a_scored_chunk_halves_it_and_the_scores_stay(make_runner):
    whole = make_runner(FakeBackend(noisy=True)).run_batch([scored()])[0]
    halved = make_runner(FakeBackend(noisy=True, no_kv_slot_above=12)).run_batch([scored()])[0]
    assert [entry.logprob for entry in halved.prompt_logprobs] == [entry.logprob for entry in whole.prompt_logprobs]


def test_token_id_prompts_score_as_their_text_does_and_an_id_outside_the_vocabulary_is_its_error(make_runner):
    runner = make_runner(FakeBackend(noisy=True))
    tokens = (BOS, *PROMPT.encode())
    by_text, by_ids, outside = runner.run_batch([scored(), scored(prompt=tokens), scored(prompt=(BOS, 104, 9999))])
    assert by_ids.prompt_logprobs == by_text.prompt_logprobs
    assert not outside.ok and "prompt token 9999 is not in the vocabulary" in outside.error


def test_a_scored_prompt_longer_than_the_window_is_refused_not_slid(make_runner):
    runner = make_runner(FakeBackend(noisy=True, window=32))
    [result] = runner.run_batch([scored(prompt="x" * 40)])
    assert not result.ok and "must fit the slot's 32-token window" in result.error


def test_the_end_of_generation_token_that_ended_a_scored_output_keeps_its_log_probability(make_runner):
    backend = FakeBackend(replies={PROMPT: ""})  # EOS comes first
    [result] = make_runner(backend).run_batch([scored()])
    assert result.completion_tokens == 1 and result.logprobs == ()
    assert result.end_logprob is not None and result.end_logprob.token_id == EOS


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_prompt_logprobs_is_none_or_a_count_up_to_20(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


CONTEXT = "Question: which of these words names a colour of the clear sky at noon?\nAnswer:"
CHOICES = [" blue", " green", " loud", " seven"]


def test_a_scored_prompt_reuses_what_a_scored_prompt_left_with_its_scores_and_scores_as_if_computed_whole(make_runner):
    """The choices of one question share their context: computed once, its scores kept with
    its KV, the other choices compute only from the last shared token on."""
    fresh = [make_runner(FakeBackend(noisy=True)).run_batch([scored(CONTEXT + choice)])[0] for choice in CHOICES]
    runner = make_runner(FakeBackend(noisy=True))
    one_by_one = [runner.run_batch([scored(CONTEXT + choice)])[0] for choice in CHOICES]
    assert one_by_one[0].prompt_tokens_cached == 0
    assert all(result.prompt_tokens_cached >= len(CONTEXT) for result in one_by_one[1:]), "the context is reused"
    for reused, whole in zip(one_by_one, fresh):
        assert reused.prompt_logprobs == whole.prompt_logprobs


def test_choices_sent_together_wait_for_the_first_to_leave_the_shared_context(make_runner):
    runner = make_runner(FakeBackend(noisy=True, num_slots=4))
    together = runner.run_batch([scored(CONTEXT + choice) for choice in CHOICES])
    fresh = make_runner(FakeBackend(noisy=True)).run_batch([scored(CONTEXT + CHOICES[-1])])[0]
    assert sorted(result.prompt_tokens_cached > 0 for result in together) == [False, True, True, True]
    assert together[-1].prompt_logprobs == fresh.prompt_logprobs


def test_kept_scores_serve_fewer_alternatives_but_not_more(make_runner):
    runner = make_runner(FakeBackend(noisy=True))
    runner.run_batch([scored(CONTEXT + CHOICES[0], top=3)])
    fewer, more = runner.run_batch([scored(CONTEXT + CHOICES[1], top=1)])[0], \
        runner.run_batch([scored(CONTEXT + CHOICES[2], top=5)])[0]
    assert fewer.prompt_tokens_cached > 0 and all(len(entry.top_logprobs) == 1 for entry in fewer.prompt_logprobs)
    assert more.prompt_tokens_cached == 0 and all(len(entry.top_logprobs) == 5 for entry in more.prompt_logprobs)


def test_a_scored_context_pushed_out_of_the_slots_comes_back_from_host_memory_with_its_scores(make_runner):
    """lm-eval sends requests longest first, so a question's choices come apart, other
    questions between them: a context that left the slots was saved to host memory with its
    log probabilities, and the next choice restores both instead of computing them again."""
    fresh = make_runner(FakeBackend(noisy=True)).run_batch([scored(CONTEXT + CHOICES[1])])[0]
    runner = make_runner(FakeBackend(noisy=True, num_slots=2, state_bytes_per_token=8))
    runner.run_batch([scored(CONTEXT + CHOICES[0])])
    for other in ("How many legs has a spider, counting them one by one? Eight",
                  "Which planet is the closest one to the sun in our solar system? Mercury"):
        runner.run_batch([scored(other)])  # the second takes the context's slot (the least recently used)
    [restored] = runner.run_batch([scored(CONTEXT + CHOICES[1])])
    assert restored.prompt_tokens_from_ram >= len(CONTEXT) - 1
    assert restored.prompt_logprobs == fresh.prompt_logprobs
