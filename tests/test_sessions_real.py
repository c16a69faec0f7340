"""Conversations that come back, on both real models: the next turn reuses the last one's prompt
and reply from its slot, or from host memory after another conversation took the slot, and
continues as a fresh prefill of the same history does."""

from __future__ import annotations

import pytest

from helpers import assert_same_greedy_texts
from multiseq import Request, SamplingParams

pytestmark = pytest.mark.model

BOTH_MODELS = ["smollm", "gemma"]
SYSTEM = ("You are a patient tutor. Answer in two short sentences, plainly, without lists. When a question "
          "builds on an earlier one, say how the two connect. ")
GREEDY = SamplingParams(max_tokens=24, temperature=0)
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why is the sky blue?"}]
OTHER = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do bees make honey?"}]


def next_turn(messages: list[dict], reply: str, question: str) -> list[dict]:
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": question}]


def ask(runner, messages: list[dict], sampling: SamplingParams = GREEDY):
    return runner.submit(Request(messages=messages, sampling=sampling)).result(timeout=120)


def rerendered_tokens(runner, first, messages: list[dict], history: list[dict]) -> int:
    """How many tokens of the first turn (`messages` and the reply `first`, asked with
    logprobs) the next turn's prompt (`history`) starts with: all of them where the chat
    template writes the reply back into the very tokens the model generated."""
    generated = [*runner.prompt_tokens(Request(messages=messages)), *(entry.token_id for entry in first.logprobs)]
    rendered = runner.prompt_tokens(Request(messages=history))
    return next((index for index, (one, other) in enumerate(zip(generated, rendered)) if one != other),
                min(len(generated), len(rendered)))


@pytest.mark.parametrize("model_name", BOTH_MODELS)
def test_the_next_turn_reusing_its_reply_continues_as_a_fresh_prefill(request, model_name, real_runner):
    model = request.getfixturevalue(model_name)
    runner = real_runner(model, 1)
    first = ask(runner, FIRST, SamplingParams(max_tokens=24, temperature=0, logprobs=True))  # (its token ids)
    second_messages = next_turn(FIRST, first.text, "And why are sunsets red?")
    second = ask(runner, second_messages)
    held = first.prompt_tokens + first.completion_tokens - 2
    if second.prompt_tokens_cached < held and rerendered_tokens(runner, first, FIRST, second_messages) < held:
        pytest.skip("premise did not hold: the chat template writes this machine's greedy reply back into other "
                    f"tokens than the model generated ({first.text!r}), so only part of it can be reused")
    assert second.prompt_tokens_cached >= held, "the last prompt and the reply came from the slot"
    fresh = ask(real_runner(model, 1), second_messages)
    assert fresh.prompt_tokens_cached == 0
    # The reply's KV was computed a token at a time, the fresh prefill computes it in one chunk.
    assert_same_greedy_texts([second.text], [fresh.text], model, "the next turn over its reused reply continues as "
                             "a fresh prefill of the same history does")


@pytest.mark.parametrize("model_name", BOTH_MODELS)
def test_a_turn_restored_from_host_memory_continues_as_if_it_never_left(request, model_name, real_runner):
    """One slot, two conversations: the first one's state goes to host memory when the other
    takes the slot, and comes back for its next turn, which must equal the same turn taken
    while the state stayed in the slot (the restored KV is the saved one, bit for bit)."""
    model = request.getfixturevalue(model_name)
    stayed = real_runner(model, 1)
    first = ask(stayed, FIRST)
    second_messages = next_turn(FIRST, first.text, "And why are sunsets red?")
    in_slot = ask(stayed, second_messages)
    moved = real_runner(model, 1)
    assert ask(moved, FIRST).text == first.text
    ask(moved, OTHER)  # takes the slot: the first conversation's KV goes to host memory
    restored = ask(moved, second_messages)
    assert restored.prompt_tokens_from_ram == restored.prompt_tokens_cached == in_slot.prompt_tokens_cached
    assert restored.text == in_slot.text
    assert moved.stats().prompt_tokens_restored == restored.prompt_tokens_from_ram


def test_gemma_does_not_restore_a_shorter_prefix_whose_window_was_not_saved(gemma, real_runner):
    """Gemma 3's sliding-window cache saves only the cells inside its window (512 positions):
    a state cut back to a prefix that ends long before the state's end misses the window the
    next tokens attend to. Such a restore is refused and the prompt prefilled instead."""
    runner = real_runner(gemma, 1, slot_ctx=2048)
    long_system = SYSTEM * 20  # ~640 tokens: the saved state runs past the window
    history = [{"role": "system", "content": long_system}, {"role": "user", "content": "Why is the sky blue?"}]
    ask(runner, history)
    ask(runner, OTHER)  # the long conversation's state goes to host memory
    other_question = [{"role": "system", "content": long_system}, {"role": "user", "content": "What is a comet?"}]
    result = ask(runner, other_question)
    assert runner.engine.host_cache.stats.num_saved >= 1
    assert result.prompt_tokens_from_ram == 0 and result.prompt_tokens_cached == 0
    assert result.text == ask(real_runner(gemma, 1, slot_ctx=2048), other_question).text


def test_gemma_restores_a_conversation_longer_than_its_window_when_the_next_turn_extends_it(gemma, real_runner):
    """Cut back at (or near) its end, a saved state holds the window the next tokens need."""
    long_system = SYSTEM * 20
    history = [{"role": "system", "content": long_system}, {"role": "user", "content": "Why is the sky blue?"}]
    stayed = real_runner(gemma, 1, slot_ctx=2048)
    first = ask(stayed, history)
    second_messages = next_turn(history, first.text, "And why are sunsets red?")
    in_slot = ask(stayed, second_messages)
    moved = real_runner(gemma, 1, slot_ctx=2048)
    ask(moved, history)
    ask(moved, OTHER)
    restored = ask(moved, second_messages)
    assert restored.prompt_tokens_from_ram == in_slot.prompt_tokens_cached > 600
    assert restored.text == in_slot.text


@pytest.mark.parametrize("model_name", BOTH_MODELS)
def test_a_prefix_brought_from_another_runner_continues_as_if_computed_there(request, model_name, real_runner):
    """Replicas of one model: the KV of a conversation computed on one runner is exported and
    imported into another's host memory, which restores it instead of prefilling it. The next
    turn there must equal the same turn taken where the conversation stayed (bit for bit)."""
    model = request.getfixturevalue(model_name)
    home = real_runner(model, 1)
    first = ask(home, FIRST)
    second_messages = next_turn(FIRST, first.text, "And why are sunsets red?")
    elsewhere = real_runner(model, 1)
    tokens = elsewhere.prompt_tokens(Request(messages=second_messages, sampling=GREEDY))
    holding = home.prefix_holding(tokens, share_more_than=elsewhere.prefix_holding(tokens).num_held)
    assert holding.shared is not None and elsewhere.import_prefix(holding.shared)
    moved = ask(elsewhere, second_messages)
    stayed = ask(home, second_messages)
    assert moved.prompt_tokens_from_ram == moved.prompt_tokens_cached == stayed.prompt_tokens_cached
    assert moved.prompt_tokens_cached > first.prompt_tokens, "the first turn's prompt and reply came over"
    assert moved.text == stayed.text
