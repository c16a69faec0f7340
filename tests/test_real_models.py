"""The runner on real GGUF models from the registry: parity, concurrency, stops, seeds, chat."""

from __future__ import annotations

import pytest

from multiseq import FinishReason, Request, SamplingParams

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
    "The three primary colors are", "Water boils at", "A haiku about the sea:", "1, 1, 2, 3, 5, 8,",
    "The best way to learn a language is", "import numpy as np\n", "Dear Sir or Madam,",
    "The mitochondria is", "In 1969, humans", "My favourite recipe is", "SELECT * FROM",
    "The quick brown fox", "Photosynthesis converts",
]


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **extra)


def test_greedy_parallel_8_matches_parallel_1_and_keeps_8_slots_busy(smollm, real_runner,
                                                                     assert_slots_hold_only_kept_prefixes):
    requests = [Request(prompt=prompt, id=f"p{index}", sampling=greedy(32, ignore_eos=True))
                for index, prompt in enumerate(PROMPTS)]
    sequential = real_runner(smollm, 1).run_batch(requests)
    batched_runner = real_runner(smollm, 8)
    batched = batched_runner.run_batch(requests)
    assert [r.text for r in batched] == [r.text for r in sequential]
    assert all(r.completion_tokens == 32 and r.text.strip() for r in batched)
    assert batched_runner.stats().avg_seqs_per_decode_step > 4
    assert_slots_hold_only_kept_prefixes(batched_runner)


def test_stop_string_and_max_tokens(multiseq_runner):
    stop_at_newline, five_tokens = multiseq_runner.run_batch([
        Request(prompt="List three fruits:\n1.", sampling=greedy(64, stop=("\n",))),
        Request(prompt="Count: one, two, three,", sampling=greedy(5, ignore_eos=True)),
    ])
    assert stop_at_newline.finish_reason is FinishReason.STOP and "\n" not in stop_at_newline.text
    assert stop_at_newline.text.strip()
    assert five_tokens.finish_reason is FinishReason.LENGTH and five_tokens.completion_tokens == 5


def test_seeds_reproduce_and_differ(multiseq_runner):
    def sample(seed: int) -> str:
        sampling = SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)
        return multiseq_runner.run_batch([Request(prompt="Write a story about a dragon.", sampling=sampling)])[0].text

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_a_multi_byte_character_cut_by_max_tokens_is_dropped_not_replaced(multiseq_runner):
    prompt = "Party: 🎉🎉🎉🎂🎂🎂🎈🎈🎉🎂"
    results = multiseq_runner.run_batch([Request(prompt=prompt, sampling=greedy(budget, ignore_eos=True))
                                         for budget in range(1, 9)])
    assert all("\ufffd" not in result.text for result in results)
    longest = results[-1].text
    assert all(longest.startswith(result.text) for result in results), "a shorter budget is a prefix, never U+FFFD"


def test_gemma_chat_is_rendered_in_gemma_turn_format(gemma, real_runner):
    messages = ({"role": "user", "content": "Say hello."},)
    rendered = gemma.render_chat(messages)
    assert rendered == "<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n"
    # The turn markers are Gemma's special tokens, one token each, not text spelled out.
    assert len(gemma.tokenize("<start_of_turn>")) == 2  # BOS + the marker
    [result] = real_runner(gemma, 2).run_batch([Request(messages=messages, sampling=greedy(16))])
    assert result.ok and result.completion_tokens >= 1
    assert result.prompt_tokens == len(gemma.tokenize(rendered))
    assert "<end_of_turn>" not in result.text and "<start_of_turn>" not in result.text


def test_gemma_batch_runs_every_prompt(gemma, real_runner, assert_slots_hold_only_kept_prefixes):
    runner = real_runner(gemma, 4)
    results = runner.run_batch([Request(prompt=prompt, sampling=greedy(12, ignore_eos=True)) for prompt in PROMPTS[:6]])
    stats = runner.stats()
    assert all(r.ok and r.completion_tokens == 12 and r.text.strip() for r in results)
    assert stats.decode_tokens_per_s and stats.prefill_tokens_per_s
    assert_slots_hold_only_kept_prefixes(runner)
