"""Per-slot windows on the fake backend: prompt sliding, rejection, generation shifts."""

from __future__ import annotations

import pytest

from fakes import BOS, FakeBackend
from multiseq import FinishReason, OverflowPolicy, Request, SamplingParams
from multiseq.loop.scheduler import PromptDoesNotFit, fit_prompt

WINDOW = 32


def test_fit_prompt_keeps_the_head_and_the_newest_tail():
    tokens = list(range(100))
    fit = fit_prompt(tokens, window=WINDOW, n_keep=3, max_tokens=8, policy=OverflowPolicy.SLIDE)
    assert fit.tokens == [0, 1, 2] + list(range(100 - 21, 100))
    assert fit.num_dropped == 100 - 24
    assert len(fit.tokens) + 8 <= WINDOW


def test_fit_prompt_leaves_at_most_half_the_window_for_generation():
    fit = fit_prompt(list(range(100)), window=WINDOW, n_keep=1, max_tokens=1000, policy=OverflowPolicy.SLIDE)
    assert len(fit.tokens) == WINDOW // 2


def test_fit_prompt_rejects_naming_both_sizes():
    with pytest.raises(PromptDoesNotFit, match="40 tokens.*32 tokens"):
        fit_prompt(list(range(40)), window=WINDOW, n_keep=1, max_tokens=8, policy=OverflowPolicy.REJECT)


def test_reject_caps_a_max_tokens_beyond_the_window_to_what_it_leaves():
    """Agents ask for more than a small window holds; the prompt loses nothing, and the
    generation ends at the window (finish_reason length), as llama-server does."""
    capped = fit_prompt(list(range(20)), window=WINDOW, n_keep=1, max_tokens=20, policy=OverflowPolicy.REJECT)
    assert (capped.tokens, capped.num_dropped, capped.max_tokens) == (list(range(20)), 0, 12)
    assert fit_prompt(list(range(20)), window=WINDOW, n_keep=1, max_tokens=12, policy=OverflowPolicy.REJECT).max_tokens == 12


def test_no_max_tokens_generates_until_the_window_is_full(make_runner):
    with make_runner(FakeBackend(num_slots=1, window=WINDOW)) as runner:
        [result] = runner.run_batch([Request(prompt="x" * 9, sampling=SamplingParams(max_tokens=None, temperature=0))])
    assert result.finish_reason is FinishReason.LENGTH and result.completion_tokens == WINDOW - 10  # BOS + 9 bytes
    assert not result.truncated


def test_a_prompt_over_the_window_is_slid_and_says_so(make_runner):
    backend = FakeBackend(num_slots=2, window=WINDOW)
    with make_runner(backend) as runner:
        [result] = runner.run_batch([Request(prompt="x" * 50, sampling=SamplingParams(max_tokens=8, temperature=0))])
    assert result.ok and result.truncated
    assert result.prompt_tokens == 51 and result.prompt_tokens_dropped == 51 - (WINDOW - 8)
    assert result.completion_tokens == 8


def test_reject_fails_that_prompt_alone(make_runner):
    backend = FakeBackend(num_slots=2, window=WINDOW)
    requests = [
        Request(prompt="ok one", sampling=SamplingParams(max_tokens=4, temperature=0)),
        Request(prompt="y" * 50, overflow="reject", sampling=SamplingParams(max_tokens=4, temperature=0)),
        Request(prompt="ok two", sampling=SamplingParams(max_tokens=4, temperature=0)),
    ]
    with make_runner(backend) as runner:
        first, rejected, second = runner.run_batch(requests)
    assert first.ok and second.ok
    assert rejected.finish_reason is FinishReason.ERROR and "51 tokens" in rejected.error and "32 tokens" in rejected.error


def test_a_prompt_that_can_never_fit_is_an_error_for_that_request(make_runner):
    backend = FakeBackend(window=WINDOW)
    with make_runner(backend) as runner:
        [result] = runner.run_batch([Request(prompt="z" * 60, n_keep=30, sampling=SamplingParams(max_tokens=4))])
    assert result.finish_reason is FinishReason.ERROR and "n_keep" in result.error


def test_generation_past_the_window_shifts_and_runs_to_max_tokens(make_runner):
    backend = FakeBackend(num_slots=4, window=WINDOW)
    requests = [Request(prompt=f"s{index}", sampling=SamplingParams(max_tokens=3 * WINDOW, temperature=0))
                for index in range(4)]
    with make_runner(backend) as runner:
        results = runner.run_batch(requests)
    assert all(r.completion_tokens == 3 * WINDOW and r.truncated and r.tokens_shifted_out > 0 for r in results)
    slot, keep, discard = backend.shifts[0]
    assert (keep, discard) == (1, (WINDOW - 1) // 2), "keep BOS, drop half of the rest, as llama.cpp does"
    shift_steps = {}
    for index, (slot, _, _) in enumerate(backend.shifts):
        shift_steps.setdefault(slot, []).append(index)
    assert len(shift_steps) == 4
    assert backend.kv == [[BOS]] * 4, "a shifted slot keeps only the prompt tokens still at their positions"


def test_n_keep_and_n_discard_are_honoured(make_runner):
    backend = FakeBackend(num_slots=1, window=WINDOW)
    with make_runner(backend, n_keep=4, n_discard=6) as runner:
        [result] = runner.run_batch([Request(prompt="abcdef", sampling=SamplingParams(max_tokens=60, temperature=0))])
    assert result.completion_tokens == 60
    assert {(keep, discard) for _, keep, discard in backend.shifts} == {(5, 6)}


def test_n_discard_at_or_above_the_window_is_clamped_with_a_warning(make_runner):
    backend = FakeBackend(num_slots=1, window=WINDOW)
    with pytest.warns(UserWarning, match="n_discard=100"):
        runner = make_runner(backend, n_discard=100)
    with runner:
        [result] = runner.run_batch([Request(prompt="a", sampling=SamplingParams(max_tokens=80, temperature=0))])
    assert result.completion_tokens == 80
    assert all(discard < WINDOW for _, _, discard in backend.shifts)


def test_where_memory_cannot_shift_the_sequence_ends_as_length_and_truncated(make_runner):
    backend = FakeBackend(num_slots=2, window=WINDOW, can_shift=False)
    with make_runner(backend) as runner:
        long, short = runner.run_batch([
            Request(prompt="long", sampling=SamplingParams(max_tokens=100, temperature=0)),
            Request(prompt="short", sampling=SamplingParams(max_tokens=5, temperature=0)),
        ])
    assert long.finish_reason is FinishReason.LENGTH and long.truncated and long.error is None
    assert long.completion_tokens == WINDOW - 5 + 1  # window filled: BOS + "long" + generated tokens
    assert short.ok and not short.truncated
    backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)


def test_sequences_that_do_not_shift_are_unaffected_by_those_that_do(make_runner):
    def short_texts(with_long: bool) -> list[str]:
        backend = FakeBackend(num_slots=3, window=WINDOW)
        requests = [Request(prompt="aa", sampling=SamplingParams(max_tokens=10, temperature=0)),
                    Request(prompt="bb", sampling=SamplingParams(max_tokens=12, temperature=0))]
        if with_long:
            requests.append(Request(prompt="cc", sampling=SamplingParams(max_tokens=200, temperature=0)))
        with make_runner(backend) as runner:
            return [result.text for result in runner.run_batch(requests)[:2]]

    assert short_texts(with_long=True) == short_texts(with_long=False)
