"""The scheduler's rules on a fake backend: no model, milliseconds."""

from __future__ import annotations

import pytest

from fakes import FakeBackend
from multiseq import FinishReason, OverflowPolicy, Request, RunnerConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0)


def prompts(count: int) -> list[Request]:
    return [Request(prompt=f"prompt number {index}", id=f"p{index}", sampling=GREEDY) for index in range(count)]


def test_n_requests_in_give_n_results_out_in_input_order(make_runner):
    with make_runner(FakeBackend(num_slots=3)) as runner:
        results = runner.run_batch(prompts(10))
    assert [result.id for result in results] == [f"p{index}" for index in range(10)]
    assert all(result.ok and result.error is None for result in results)


def test_max_tokens_is_respected_exactly(make_runner):
    requests = [Request(prompt="x" * (index + 1), sampling=SamplingParams(max_tokens=index + 1, temperature=0))
                for index in range(6)]
    with make_runner(FakeBackend(num_slots=2)) as runner:
        results = runner.run_batch(requests)
    assert [result.completion_tokens for result in results] == [1, 2, 3, 4, 5, 6]
    assert all(result.finish_reason is FinishReason.LENGTH for result in results)
    assert [len(result.text) for result in results] == [1, 2, 3, 4, 5, 6]  # one byte per token


def test_slots_are_reused_and_keep_only_their_prompt(make_runner):
    backend = FakeBackend(num_slots=2)
    with make_runner(backend) as runner:
        results = runner.run_batch(prompts(6))
        assert all(result.ok for result in results)
        assert runner.engine.scheduler.num_free_slots == 2
    used_slots = {slot for call in backend.calls for slot, _, _ in call.entries}
    assert used_slots == {0, 1}
    backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)
    prefills_per_slot = [sum(1 for call in backend.calls for slot, _, is_prefill in call.entries
                             if is_prefill and slot == wanted) for wanted in (0, 1)]
    assert min(prefills_per_slot) >= 2, "each slot served more than one request"


def test_every_step_holds_one_token_per_decoding_sequence_and_at_most_n_batch(make_runner):
    backend = FakeBackend(num_slots=4, n_batch=16)
    requests = [Request(prompt="p" * (5 + 7 * index), sampling=SamplingParams(max_tokens=3 + index, temperature=0))
                for index in range(9)]
    with make_runner(backend) as runner:
        assert all(result.ok for result in runner.run_batch(requests))
    assert backend.calls, "the runner decoded"
    for call in backend.calls:
        assert call.num_tokens <= 16
        assert call.decoding_slots == call.slots_with_pending_token, "every decoding sequence gets its token"
        for slot, num_tokens, is_prefill in call.entries:
            assert is_prefill or num_tokens == 1


def test_a_long_prompt_is_prefilled_in_chunks_while_others_keep_decoding(stepped_engine):
    backend = FakeBackend(num_slots=2, n_batch=8)
    stepped = stepped_engine(backend)
    short = stepped.submit(Request(prompt="ab", sampling=SamplingParams(max_tokens=20, temperature=0)))
    stepped.step()  # the short prompt prefills alone
    long = stepped.submit(Request(prompt="z" * 40, sampling=SamplingParams(max_tokens=2, temperature=0)))
    stepped.run()
    assert stepped.result(short).completion_tokens == 20 and stepped.result(long).completion_tokens == 2
    mixed = [call for call in backend.calls if any(p for _, _, p in call.entries) and call.decoding_slots]
    assert len(mixed) >= 4, "the 41-token prompt went in several chunks beside a decoding sequence"


def test_stop_string_ends_generation_and_is_not_emitted(make_runner):
    backend = FakeBackend(replies={"q": "The answer is 42.\nEND and more"})
    with make_runner(backend) as runner:
        [result] = runner.run_batch([Request(prompt="q", sampling=SamplingParams(max_tokens=50, stop=("END",), temperature=0))])
    assert result.text == "The answer is 42.\n"
    assert result.finish_reason is FinishReason.STOP


def test_partial_stop_string_is_held_then_released(make_runner):
    backend = FakeBackend(replies={"q": "ENTER END"})
    with make_runner(backend) as runner:
        handle = runner.submit(Request(prompt="q", sampling=SamplingParams(max_tokens=50, stop=("END",), temperature=0)),
                               stream=True)
        pieces = list(handle)
    assert "".join(pieces) == "ENTER "
    assert handle.result().text == "ENTER "
    # "E" and "EN" could start "END": they are held, then released with the "T" that rules it out.
    assert pieces == ["ENT", "ER", " "]


def test_streamed_pieces_never_hold_half_a_character(make_runner):
    reply = "héllo wörld ✓ 日本"
    backend = FakeBackend(replies={"q": reply})
    with make_runner(backend) as runner:
        handle = runner.submit(Request(prompt="q", sampling=SamplingParams(max_tokens=100, temperature=0)), stream=True)
        pieces = list(handle)
    assert "".join(pieces) == reply
    assert all("\ufffd" not in piece for piece in pieces)
    assert len(pieces) < len(reply.encode("utf-8")), "multi-byte characters came out whole, not byte by byte"


def test_end_of_generation_finishes_with_stop_and_ignore_eos_keeps_going(make_runner):
    backend = FakeBackend(replies={"q": "hi"})
    with make_runner(backend) as runner:
        stopped, ignored = runner.run_batch([
            Request(prompt="q", sampling=SamplingParams(max_tokens=10, temperature=0)),
            Request(prompt="q", sampling=SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)),
        ])
    assert (stopped.text, stopped.finish_reason) == ("hi", FinishReason.STOP)
    assert ignored.finish_reason is FinishReason.LENGTH and ignored.completion_tokens == 10
    assert ignored.text.startswith("hi")


def test_seeded_sampling_is_reproducible_and_independent_of_batch_composition(make_runner):
    def run(parallel: int, seeds: list[int]) -> list[str]:
        backend = FakeBackend(num_slots=parallel, noisy=True)
        requests = [Request(prompt=f"seed test {index}", id=f"s{index}",
                            sampling=SamplingParams(max_tokens=24, temperature=1.5, top_k=20, top_p=0.99, min_p=0.0,
                                                    seed=seed))
                    for index, seed in enumerate(seeds)]
        with make_runner(backend) as runner:
            return [result.text for result in runner.run_batch(requests)]

    alone = run(1, [7, 8, 9, 10])
    batched = run(4, [7, 8, 9, 10])
    reseeded = run(4, [70, 80, 90, 100])
    assert alone == batched
    assert sum(a != b for a, b in zip(alone, reseeded)) >= 3


def test_requests_without_seed_follow_the_runner_seed(make_runner):
    def run(runner_seed: int) -> list[str]:
        backend = FakeBackend(noisy=True)
        requests = [Request(prompt="same", id=f"r{index}", sampling=SamplingParams(max_tokens=16, temperature=1.5,
                                                                                   min_p=0.0))
                    for index in range(4)]
        with make_runner(backend, seed=runner_seed) as runner:
            return [result.text for result in runner.run_batch(requests)]

    first, again, other = run(1), run(1), run(2)
    assert first == again
    assert len(set(first)) > 1, "different ids draw differently under one runner seed"
    assert first != other


def test_duplicate_id_while_running_is_an_error_for_that_request_only(make_runner):
    with make_runner(FakeBackend(num_slots=2)) as runner:  # a batch's requests reach the engine's owner together
        first, second = runner.run_batch([Request(prompt="a", id="same", sampling=GREEDY),
                                          Request(prompt="b", id="same", sampling=GREEDY)])
        assert runner.num_waiting == 0, "the duplicate is no longer counted as waiting, once and only once"
    assert second.finish_reason is FinishReason.ERROR and "already" in second.error
    assert first.ok


def test_chat_messages_are_rendered_with_the_template(make_runner):
    backend = FakeBackend(replies={"<user>hello<assistant>": "hey"})
    with make_runner(backend) as runner:
        [result] = runner.run_batch([Request(messages=[{"role": "user", "content": "hello"}], sampling=GREEDY)])
    assert result.text == "hey"


def test_stats_count_decode_steps_and_concurrency(make_runner):
    backend = FakeBackend(num_slots=4)
    with make_runner(backend) as runner:
        runner.run_batch(prompts(8))
        stats = runner.stats()
    decode_calls = [call for call in backend.calls if call.decoding_slots]
    assert stats.generated_tokens == 8 * GREEDY.max_tokens
    assert stats.num_steps == len(backend.calls)
    assert stats.num_decode_steps == len(decode_calls) < len(backend.calls), "prefill-only steps are not decode steps"
    assert stats.avg_seqs_per_decode_step == sum(len(call.decoding_slots) for call in decode_calls) / len(decode_calls)
    assert stats.avg_seqs_per_decode_step > 3
    prefilled = sum(n for call in backend.calls for _, n, is_prefill in call.entries if is_prefill)
    assert stats.prompt_tokens == prefilled, "prompt tokens computed"
    assert stats.prompt_tokens + stats.prompt_tokens_reused == 8 * len(FakeBackend().tokenize("prompt number 0"))
    assert set(stats.phase_seconds) == {"schedule", "decode", "sample", "postprocess"}


def test_prefill_rate_is_unavailable_without_a_prefill_only_step(make_runner):
    with make_runner(FakeBackend(num_slots=1)) as runner:
        assert runner.stats().prefill_tokens_per_s is None
        runner.run_batch([Request(prompt="abc", sampling=GREEDY)])
        assert runner.stats().prefill_tokens_per_s is not None


def test_no_kv_slot_halves_the_prompt_chunk_and_retries(make_runner):
    backend = FakeBackend(num_slots=2, n_batch=32, no_kv_slot_above=6)
    with make_runner(backend) as runner:
        [result] = runner.run_batch([Request(prompt="y" * 20, sampling=GREEDY)])
    assert result.ok and result.completion_tokens == GREEDY.max_tokens
    assert max(call.num_tokens for call in backend.calls) <= 6


def test_invalid_sampling_values_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="exactly one"):
        Request()


def test_config_rejects_n_batch_below_parallel():
    with pytest.raises(ValueError, match="n_batch"):
        RunnerConfig(parallel=16, n_batch=8)


def test_overflow_policy_accepts_strings():
    assert RunnerConfig(overflow="reject").overflow is OverflowPolicy.REJECT


def test_a_character_cut_by_max_tokens_is_dropped_not_replaced(make_runner):
    backend = FakeBackend(replies={"q": "日本"})  # three bytes, so three tokens, each
    with make_runner(backend) as runner:
        handle = runner.submit(Request(prompt="q", sampling=SamplingParams(max_tokens=4, temperature=0)), stream=True)
        pieces = list(handle)
    assert pieces == ["日"] and handle.result().text == "日"
