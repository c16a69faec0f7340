"""Conversations that come back, on the fake backend: the next turn reuses the last one's prompt
and reply from its slot, or from host memory once another conversation took the slot; host
memory is bounded and evicts the least recently used state; restoring happens only when it
costs less than computing. The fake computes a token's output from the tokens alone, so every
turn's text must equal a fresh runner's: the bookkeeping of what is reused is exact."""

from __future__ import annotations

import numpy as np

from fakes import FakeBackend
from multiseq import Request, SamplingParams
from multiseq.llama.batch import ChunkRules
from multiseq.kv.hostcache import CostModel, HostCache

GREEDY = SamplingParams(max_tokens=60, temperature=0)
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 2


def turn(history: list[dict], user: str) -> list[dict]:
    return [*history, {"role": "user", "content": user}]


def rendered(messages: list[dict]) -> str:
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def reply_for(messages: list[dict]) -> str:
    return f"Answer {len(messages)} about {messages[-1]['content'][:12]}."


def scripted(conversations: list[list[str]]) -> dict[str, str]:
    """The fake's replies for every turn of every conversation (each with the system prompt)."""
    replies = {}
    for users in conversations:
        history = [{"role": "system", "content": SYSTEM}]
        for user in users:
            messages = turn(history, user)
            replies[rendered(messages)] = reply_for(messages)
            history = [*messages, {"role": "assistant", "content": reply_for(messages)}]
    return replies


def run_conversations(make_runner, conversations, order, backend, **config):
    """Run the turns in `order` (conversation index per turn): each turn sends the whole
    history so far, as an OpenAI client does. Returns the results by (conversation, turn)."""
    runner = make_runner(backend, **config)
    histories = [[{"role": "system", "content": SYSTEM}] for _ in conversations]
    turns_done = [0] * len(conversations)
    results = {}
    for index in order:
        user = conversations[index][turns_done[index]]
        messages = turn(histories[index], user)
        result = runner.submit(Request(messages=messages, sampling=GREEDY)).result(timeout=10)
        histories[index] = [*messages, {"role": "assistant", "content": result.text}]
        results[(index, turns_done[index])] = result
        turns_done[index] += 1
    return results, runner


CONVERSATIONS = [["What is the sea?", "And the sky?", "And the moon?"],
                 ["Tell me about cats.", "And dogs?", "And birds?"]]


def test_the_next_turn_reuses_the_last_prompt_and_reply_from_its_slot(make_runner):
    backend = FakeBackend(num_slots=2, window=512, replies=scripted(CONVERSATIONS))
    results, _ = run_conversations(make_runner, CONVERSATIONS, [0, 0, 0], backend)
    for number in (1, 2):
        before, now = results[(0, number - 1)], results[(0, number)]
        assert now.text == reply_for([None] * (2 * number + 1) + [{"content": CONVERSATIONS[0][number]}])
        # The last turn's prompt and reply (but the end-of-generation token, never decoded)
        # were in the slot; the new prompt repeats them, then adds the reply's end and a question.
        assert now.prompt_tokens_cached == before.prompt_tokens + before.completion_tokens - 1
        assert now.prompt_tokens_from_ram == 0


def test_turns_of_two_conversations_on_one_slot_come_back_from_host_memory(make_runner):
    backend = FakeBackend(num_slots=1, window=512, replies=scripted(CONVERSATIONS))
    results, runner = run_conversations(make_runner, CONVERSATIONS, [0, 1, 0, 1, 0, 1], backend)
    for (conversation, number), result in results.items():
        assert result.ok and result.text == reply_for([None] * (2 * number + 1) + [
            {"content": CONVERSATIONS[conversation][number]}])
        if number:
            before = results[(conversation, number - 1)]
            assert result.prompt_tokens_from_ram == result.prompt_tokens_cached == \
                before.prompt_tokens + before.completion_tokens - 1, "restored whole from host memory"
    assert len(backend.restores) == 4 and len(backend.saves) >= 4
    stats = runner.stats()
    assert stats.prompt_tokens_restored == sum(r.prompt_tokens_from_ram for r in results.values())


def test_the_same_turns_without_host_memory_compute_the_history_again(make_runner):
    backend = FakeBackend(num_slots=1, window=512, replies=scripted(CONVERSATIONS))
    results, _ = run_conversations(make_runner, CONVERSATIONS, [0, 1, 0, 1, 0, 1], backend, cache_ram_mib=0)
    assert not backend.saves and not backend.restores
    assert all(result.prompt_tokens_from_ram == 0 for result in results.values())
    # Only the system prompt and its template header, shared by both, comes from the slot.
    assert max(result.prompt_tokens_cached for result in results.values()) < len(SYSTEM) + 20


def test_host_memory_is_bounded_and_evicts_the_least_recently_used_state(make_runner):
    """States of 4 KiB a token: 1 MiB holds two conversations' states, not five."""
    conversations = [[f"Question {index} about topic {index}?", f"Follow-up {index}?"] for index in range(5)]
    backend = FakeBackend(num_slots=1, window=512, replies=scripted(conversations), state_bytes_per_token=4096)
    order = list(range(5)) + list(range(5))
    results, runner = run_conversations(make_runner, conversations, order, backend, cache_ram_mib=1)
    cache = runner.engine.host_cache
    assert cache.num_bytes <= 2**20 and cache.num_entries <= 2 and cache.stats.num_evicted >= 3
    assert all(result.ok for result in results.values())
    # The first conversations' states were evicted by the later ones: their second turns
    # were computed again (all but the shared system prompt), not restored.
    assert results[(0, 1)].prompt_tokens_from_ram == 0
    assert results[(4, 1)].prompt_tokens_from_ram > 0, "the most recent state is still there"


def test_exact_reuse_keeps_only_the_prompt_in_a_free_slot(make_runner):
    """Where reuse must be exact (batch-invariant), generated tokens, computed a row at a
    time, are not reused as prompt: a free slot keeps its prompt only."""
    backend = FakeBackend(num_slots=1, window=512, replies=scripted(CONVERSATIONS), chunk_rules=ChunkRules())
    results, runner = run_conversations(make_runner, CONVERSATIONS, [0, 0], backend)
    assert results[(0, 1)].prompt_tokens_cached == results[(0, 0)].prompt_tokens, "the prompt, not the reply"
    assert len(runner.engine.scheduler.slots[0].kept) == results[(0, 1)].prompt_tokens


def test_a_restore_happens_only_when_it_costs_less_than_computing():
    costs = CostModel(restore_seconds_per_byte=1e-9, prefill_seconds_per_token=3e-3)
    assert costs.restoring_pays(num_bytes=30_000_000, num_tokens_saved=1200)  # 30 ms against 3.6 s
    assert not costs.restoring_pays(num_bytes=30_000_000, num_tokens_saved=5)  # 30 ms against 15 ms
    costs.note_restore(num_bytes=1000, seconds=1.0)  # a slow restore moves the estimate
    assert costs.restore_seconds_per_byte > 1e-4


def test_the_index_finds_the_longest_prefix_and_drops_states_a_newer_one_covers():
    cache = HostCache(limit_bytes=10_000)
    cache.add(np.arange(10, dtype=np.int32), bytearray(100))
    cache.add(np.arange(20, dtype=np.int32), bytearray(100))  # covers the first: it goes
    cache.add(np.array([5, 6, 7], dtype=np.int32), bytearray(100))
    assert cache.num_entries == 2 and cache.num_bytes == 200
    entry, length = cache.best_match(np.concatenate([np.arange(15), [99]]).astype(np.int32))
    assert length == 15 and len(entry.tokens) == 20
    assert cache.covers(np.arange(12, dtype=np.int32)) and not cache.covers(np.arange(25, dtype=np.int32))
    assert not cache.add(np.arange(3, dtype=np.int32), bytearray(20_000)), "larger than the whole cache"
