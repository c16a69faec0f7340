"""Preemption and the step budget on real models: a batch request preempted by an interactive
one resumes from its parked KV and writes the same text as without the interruption, and a
long prompt prefilled over many small steps gives the same greedy text as in one step
(batch-invariant mode, where the cut must not change a token's numbers)."""

from __future__ import annotations

import pytest

from helpers import sampling_seed
from multiseq import Priority, Request, SamplingParams

pytestmark = pytest.mark.model

WARM_UP_STEPS = 15
# ignore_eos: the batch request must still be running when the interactive one comes (a seeded
# draw may reach EOS within the warm-up steps on one CPU and not on another), and any draw will do.
BATCH_JOB = Request(prompt="Write a long story about a lighthouse keeper and a storm.", id="batch",
                    sampling=SamplingParams(max_tokens=40, temperature=0.8, seed=sampling_seed(21), ignore_eos=True))
CHAT = Request(messages=[{"role": "user", "content": "Say hello."}], id="chat",
               sampling=SamplingParams(max_tokens=8, temperature=0), priority=Priority.INTERACTIVE)


def step_until_done(stepped, request_ids: list[str], max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if set(request_ids) <= stepped.results.keys():
            return
        stepped.step()
    raise AssertionError("not done")


@pytest.mark.parametrize("model_name", ["smollm", "gemma"])
def test_a_preempted_batch_request_resumes_exactly(request, model_name, stepped_real_engine):
    model = request.getfixturevalue(model_name)
    alone = stepped_real_engine(model, 1)
    step_until_done(alone, [alone.submit(BATCH_JOB)])
    stepped = stepped_real_engine(model, 1)
    batch = stepped.submit(BATCH_JOB)
    stepped.steps(WARM_UP_STEPS)
    assert batch not in stepped.results, f"premise: the batch request still runs after {WARM_UP_STEPS} steps"
    step_until_done(stepped, [stepped.submit(CHAT)])
    assert batch not in stepped.results, "the interactive request went first"
    step_until_done(stepped, [batch])
    assert stepped.engine.stats.snapshot().num_preempted == 1
    assert stepped.result(batch).text == alone.result(batch).text and stepped.result(batch).completion_tokens == 40


def test_a_long_prompt_over_small_steps_gives_the_same_text_in_batch_invariant_mode(unpacked_model, real_runner):
    smollm = unpacked_model("smollm2-135m")
    long_prompt = Request(prompt="Notes: " + "The committee measured the northern hills before sunrise. " * 40
                          + "Summarize the notes:", sampling=SamplingParams(max_tokens=16, temperature=0))
    results = {}
    for step_tokens in (None, 2):
        runner = real_runner(smollm, 2, slot_ctx=1024, batch_invariant=True, step_tokens=step_tokens)
        results[step_tokens] = (runner.submit(long_prompt).result(timeout=120), runner.stats().num_steps)
    (whole, whole_steps), (chunked, chunked_steps) = results[None], results[2]
    assert whole.prompt_tokens > 350 and chunked_steps >= whole_steps + 3, "prefilled in several chunks"
    assert chunked.text == whole.text
