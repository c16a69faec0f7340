"""Shared-prefix reuse on real models: exact greedy text with and without it, on both models,
including a Gemma 3 source slot that ran far past the prefix, and a KV that holds only what
the prefix index says once requests end."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import TEST_SEED, TEST_THREADS, assert_same_greedy_texts
from multiseq import BackendError, Request, Runner, RunnerConfig, SamplingParams
from multiseq.llama.backend import LlamaBackend
from multiseq.llama.batch import BatchEntry

pytestmark = pytest.mark.model

BOTH_MODELS = ["smollm", "gemma"]
SYSTEM = ("You are a support triage assistant. Read the ticket and answer with one word: bug, feature or "
          "question. A bug is something that worked and broke, or never worked as documented. A feature is a "
          "request for something new. A question asks how to use what exists. ") * 3
TICKETS = ["The app crashes when I upload a photo.", "Please add a dark mode.", "How do I export my data?",
           "Login fails since the last update.", "Could you support CSV import?", "Where is the settings page?",
           "Sync stops after a minute.", "Is there an API for reports?"]


def chat(ticket: str, max_tokens: int = 12) -> Request:
    return Request(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}],
                   id=ticket, sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


@pytest.mark.parametrize("model_name", ["smollm2-135m", "gemma3-270m"])
def test_batch_invariant_greedy_text_is_the_same_with_and_without_reuse(model_name, unpacked_model, real_runner,
                                                                        assert_slots_hold_only_kept_prefixes):
    """One slot, batch-invariant: reused prefixes follow the chunk rules, so the text is exact."""
    model = unpacked_model(model_name)
    requests = [chat(ticket) for ticket in TICKETS[:3]]
    plain_runner = real_runner(model, 1, prefix_cache=False, batch_invariant=True)
    plain = plain_runner.run_batch(requests)
    reuse_runner = real_runner(model, 1, batch_invariant=True)
    reused = reuse_runner.run_batch(requests)
    assert [r.text for r in reused] == [r.text for r in plain]
    assert all(r.prompt_tokens_cached == 0 for r in plain)
    assert all(r.prompt_tokens_cached > 100 for r in reused[1:]), "all but the first reuse the system prompt"
    assert reuse_runner.stats().prompt_tokens < plain_runner.stats().prompt_tokens / 2
    assert_slots_hold_only_kept_prefixes(reuse_runner)
    assert_slots_hold_only_kept_prefixes(plain_runner)
    assert len(plain_runner.engine.scheduler.slots[0].kept) == 0
    reuse_runner.clear_prefix_cache()
    assert reuse_runner.backend.slot_pos_max(0) == -1


@pytest.mark.parametrize("model_name", BOTH_MODELS)
def test_default_mode_reuses_all_but_the_tokens_after_the_shared_prefix(request, model_name, real_runner,
                                                                         assert_slots_hold_only_kept_prefixes):
    """Where outputs depend on the batch anyway, a reused prefix leaves only what differs to
    compute: each later prompt reuses exactly its common prefix with the one before it."""
    model = request.getfixturevalue(model_name)
    requests = [chat(ticket) for ticket in TICKETS[:5]]
    runner = real_runner(model, 1)
    results = runner.run_batch(requests)
    prompts = [np.asarray(model.tokenize(model.render_chat(r.messages))) for r in requests]
    for before, now, result in zip(prompts, prompts[1:], results[1:]):
        shared = int(np.argmax(before[:len(now)] != now[:len(before)]))
        assert result.prompt_tokens_cached == min(shared, len(now) - 1)
        assert all(r.ok for r in results)
    assert runner.stats().prompt_tokens == len(prompts[0]) + sum(
        len(now) - result.prompt_tokens_cached for now, result in zip(prompts[1:], results[1:]))
    assert_slots_hold_only_kept_prefixes(runner)


@pytest.mark.parametrize("model_name", ["smollm2-135m", "gemma3-270m"])
def test_batch_invariant_text_is_the_same_at_any_parallelism_with_or_without_reuse(model_name, unpacked_model,
                                                                                   real_runner):
    model = unpacked_model(model_name)
    requests = [chat(ticket) for ticket in TICKETS[:6]]
    alone = real_runner(model, 1, prefix_cache=False, batch_invariant=True).run_batch(requests)
    batched = real_runner(model, 4, batch_invariant=True).run_batch(requests)
    assert [r.text for r in batched] == [r.text for r in alone]
    assert sum(r.prompt_tokens_cached > 100 for r in batched) >= 4


# A ticket of some hundred tokens: the long request gets far past the shared prefix mostly by
# its prompt, computed in chunks, rather than by decoding a token a step.
LONG_TICKET = TICKETS[0] + " What I did: " + " ".join(f"step {index}, I opened the app and uploaded photo {index}."
                                                       for index in range(25))
LONGER_TICKET = LONG_TICKET + " " + " ".join(f"step {index}, I opened the app and uploaded photo {index}."
                                             for index in range(25, 42))


def far_past_the_prefix_then_reuse(runner, num_tokens: int, ticket: str = LONG_TICKET) -> list:
    """A long request (a long ticket) runs far past the shared prefix; a request submitted near
    its end reuses the prefix from its slot. Returns both results."""
    long = runner.submit(chat(ticket, max_tokens=num_tokens), stream=True)
    for count, _ in enumerate(long, start=1):
        if count == num_tokens - 20:
            late = runner.submit(chat(TICKETS[1]))
    return [long.result(), late.result()]


def test_gemma_reuses_a_prefix_from_a_slot_that_ran_past_its_sliding_window(gemma, real_runner):
    reuse = real_runner(gemma, 2, slot_ctx=1024)
    long, late = far_past_the_prefix_then_reuse(reuse, 100)  # past position 512: Gemma's window
    assert long.prompt_tokens + long.completion_tokens > 512 + 20
    assert late.prompt_tokens_cached > 100
    [alone] = real_runner(gemma, 2, slot_ctx=1024, prefix_cache=False).run_batch([chat(TICKETS[1])])
    # Beside the long request and from a reused prefix, against alone and prefilled in full.
    assert_same_greedy_texts([late.text], [alone.text], gemma, "a reused prefix continues as a full prefill does")


def test_gemma_prefix_dropped_by_a_small_sliding_window_cache_is_prefilled_instead(gemma, real_runner):
    config = RunnerConfig(model=gemma.path, parallel=2, slot_ctx=1024, n_batch=64, threads=TEST_THREADS,
                          seed=TEST_SEED)
    backend = LlamaBackend(gemma, 2, 1024, 64, TEST_THREADS, swa_full=False)  # its SWA cache holds 768 cells a slot
    with Runner(config, backend=backend) as runner:
        # Past the 768 cells mostly by its prompt: a prompt token costs a fraction of a step.
        long, late = far_past_the_prefix_then_reuse(runner, 60, LONGER_TICKET)
        assert long.prompt_tokens + long.completion_tokens > 768 + 20
        assert late.prompt_tokens_cached == 0, "the prefix was not intact in the source slot: prefilled in full"
    [alone] = real_runner(gemma, 2, slot_ctx=1024, prefix_cache=False).run_batch([chat(TICKETS[1])])
    # Prefilled beside the long request, against alone.
    assert_same_greedy_texts([late.text], [alone.text], gemma, "a prompt prefilled in full beside a long request "
                             "writes what it writes alone", swa_full=False)


@pytest.mark.parametrize("model_name", BOTH_MODELS)
def test_a_copied_prefix_gives_the_logits_of_its_source_bit_for_bit(request, model_name):
    """Slot 1 held another prompt before: after the copy it holds the prefix and nothing else."""
    model = request.getfixturevalue(model_name)
    tokens = model.tokenize(SYSTEM)
    backend = LlamaBackend(model, 2, 512, 512, TEST_THREADS)
    try:
        backend.decode([BatchEntry(0, tokens[:-1], 0, False),
                        BatchEntry(1, model.tokenize("Translate into French: the cat sleeps. " * 4), 0, False)])
        assert backend.reuse_prefix(1, 0, len(tokens) - 1)
        both = backend.decode([BatchEntry(0, tokens[-1:], len(tokens) - 1, True),
                               BatchEntry(1, tokens[-1:], len(tokens) - 1, True)])
        assert np.array_equal(both[0], both[1])
        assert (backend.slot_pos_min(1), backend.slot_pos_max(1)) == (0, len(tokens) - 1)
    finally:
        backend.close()


def test_a_batch_invariant_runner_refuses_repacked_weights(smollm):
    with pytest.raises(BackendError, match="repack_weights=False"):
        Runner.on_model(smollm, RunnerConfig(model=smollm.path, parallel=2, batch_invariant=True))
