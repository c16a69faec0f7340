"""Prompt log probabilities on a real model: every scored token's log probability is what the
plain path reports for that token after the same prefix (the prefix run alone, its next token
forced by a logit bias, which logprobs are reported before), within what batch composition
changes in the last digits; greedy text beside a scoring request does not change."""

from __future__ import annotations

import pytest

from multiseq import Request, SamplingParams

pytestmark = pytest.mark.model

PROMPT = "Question: What color is the sky on a clear day?\nAnswer: blue"


def test_scored_prompt_tokens_match_the_plain_path_token_by_token(smollm, real_runner):
    runner = real_runner(smollm, parallel=4, slot_ctx=256)
    tokens = smollm.tokenize(PROMPT)
    [scored] = runner.run_batch([Request(prompt=tuple(tokens), sampling=SamplingParams(
        max_tokens=1, temperature=0, logprobs=True, prompt_logprobs=1))])
    assert scored.ok and [entry.token_id for entry in scored.prompt_logprobs] == tokens[1:]
    forced = [Request(prompt=tuple(tokens[:index]), sampling=SamplingParams(
        max_tokens=1, temperature=0, logprobs=True, logit_bias={tokens[index]: 100}))
        for index in range(1, len(tokens))]
    plain = runner.run_batch(forced)
    for index, (entry, reference) in enumerate(zip(scored.prompt_logprobs, plain), start=1):
        [expected] = reference.logprobs
        assert expected.token_id == tokens[index]
        assert entry.logprob == pytest.approx(expected.logprob, abs=0.02), f"token {index}"


def test_greedy_text_beside_a_scoring_request_is_the_text_without_it(unpacked_model, real_runner):
    """Batch-invariant (a step's composition would otherwise move the last digits): the
    scoring request's rows change nothing of the others'."""
    smollm = unpacked_model("smollm2-135m")
    greedy = [Request(prompt=f"Count from {start}:", sampling=SamplingParams(max_tokens=12, temperature=0,
                                                                            ignore_eos=True))
              for start in (1, 5, 9)]
    alone = real_runner(smollm, parallel=4, slot_ctx=256, batch_invariant=True).run_batch(greedy)
    score = Request(prompt=PROMPT, sampling=SamplingParams(max_tokens=1, temperature=0, logprobs=True,
                                                           prompt_logprobs=5))
    mixed = real_runner(smollm, parallel=4, slot_ctx=256, batch_invariant=True).run_batch([*greedy, score])
    assert [result.text for result in mixed[:3]] == [result.text for result in alone]
    assert mixed[3].ok and len(mixed[3].prompt_logprobs) == len(smollm.tokenize(PROMPT)) - 1
