"""Backend sampling on llama.cpp (CPU build): sampler chains in the model's graph against the
host's numpy sampler. Greedy text is identical (a logit bias and ignore_eos included), a seeded
request repeats itself (and survives a preemption), and rows that need the host share steps
with rows sampled in the graph."""

from __future__ import annotations

import pytest

from helpers import sampling_seed
from multiseq import Priority, Request, SamplingParams

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "List three colors:", "Once upon a time", "2 + 2 ="]
GREEDY = SamplingParams(max_tokens=12, temperature=0)


def sampled(seed: int) -> SamplingParams:
    """Drawn at temperature 1 under the usual filters, every token (ignore_eos: where a draw
    reaches EOS depends on the machine's arithmetic, and the tests need the whole length)."""
    return SamplingParams(max_tokens=16, temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, seed=sampling_seed(seed),
                          ignore_eos=True)


def run_all(runner, requests: list[Request]) -> dict[str, str]:
    return {result.id: result.text for result in runner.run_batch(requests)}


def test_greedy_text_is_the_same_sampled_in_the_graph_as_on_the_host(smollm, real_runner):
    ignore_eos = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)  # the end tokens at -inf in the chain
    requests = [Request(prompt=prompt, id=str(index), sampling=ignore_eos if index % 2 else GREEDY)
                for index, prompt in enumerate(PROMPTS)]
    on_host = run_all(real_runner(smollm, len(PROMPTS), sampling="host"), requests)
    in_graph_runner = real_runner(smollm, len(PROMPTS), sampling="backend")
    in_graph = run_all(in_graph_runner, requests)
    assert in_graph == on_host
    assert in_graph_runner.engine.row_sampling.num_chains == len(PROMPTS), "the slots' rows were sampled in the graph"


def test_a_seeded_request_sampled_in_the_graph_repeats_itself(smollm, real_runner):
    runner = real_runner(smollm, 2, sampling="backend")

    def draw(seed: int):
        return runner.run_batch([Request(prompt=PROMPTS[2], sampling=sampled(seed))])[0]

    first, second = draw(7), draw(7)
    assert first.ok and first.completion_tokens == sampled(7).max_tokens
    assert first.text == second.text
    # Two seeds may draw the same 16 tokens where the model is sure of each: three other seeds
    # all drawing the first one's text would mean the seed never reached llama.cpp's draw.
    others = [draw(seed).text for seed in (8, 9, 10)]
    assert any(text != first.text for text in others), f"the seed reaches llama.cpp's draw: {first.text!r} each time"


def test_rows_that_need_the_host_share_steps_with_rows_sampled_in_the_graph(smollm, real_runner):
    sampling = [
        GREEDY,
        SamplingParams(max_tokens=12, temperature=0, logit_bias={smollm.tokenize(" blue", False)[0]: 8.0}),
        SamplingParams(max_tokens=12, temperature=0, json_schema={"type": "array", "items": {"type": "integer"}}),
        SamplingParams(max_tokens=12, temperature=0, logprobs=True, top_logprobs=2),
    ]
    requests = [Request(prompt=prompt, id=str(index), sampling=params)
                for index, (prompt, params) in enumerate(zip(PROMPTS, sampling))]
    on_host = run_all(real_runner(smollm, len(PROMPTS), sampling="host"), requests)
    mixed_runner = real_runner(smollm, len(PROMPTS), sampling="backend")
    mixed = run_all(mixed_runner, requests)
    assert mixed == on_host
    assert mixed_runner.engine.row_sampling.num_chains == 2, "the greedy and the biased requests had chains"


def test_a_preempted_request_sampled_in_the_graph_resumes_its_draws(smollm, real_runner, stepped_real_engine):
    # ignore_eos: the request must still be running when the interactive one comes (where a draw
    # reaches EOS depends on the machine), and any draw will do.
    batch = Request(prompt=PROMPTS[2], id="batch", sampling=SamplingParams(
        max_tokens=24, temperature=1.0, top_k=40, seed=sampling_seed(3), ignore_eos=True), priority=Priority.BATCH)
    alone = real_runner(smollm, 1, sampling="backend").run_batch([batch])[0].text
    stepped = stepped_real_engine(smollm, 1, sampling="backend")
    stepped.submit(batch)
    stepped.steps(8)
    assert "batch" not in stepped.results, "premise: the batch request still runs after 8 steps"
    stepped.submit(Request(prompt=PROMPTS[0], id="chat", sampling=GREEDY, priority=Priority.INTERACTIVE))
    stepped.run()
    assert stepped.result("chat").ok and stepped.engine.stats.snapshot().num_preempted == 1
    assert stepped.result("batch").text == alone, "resumed on a new chain as if never interrupted"
