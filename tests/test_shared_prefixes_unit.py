"""Prefixes shared between runners of the same model (replicas on Ray Serve), on the fake
backend: one runner exports the KV of the longest prefix of a prompt it holds (a free slot's,
a running sequence's, or a state in host memory), another imports it into its host memory and
restores it for that prompt instead of prefilling it. The fake computes a token's output from
the tokens alone, so every text must equal a fresh runner's."""

from __future__ import annotations

import numpy as np

from fakes import FakeBackend
from multiseq import Request, SamplingParams
from multiseq.kv.hostcache import HostCache, SharedPrefix
from multiseq.kv.prefix import MIN_WAIT_TOKENS

GREEDY = SamplingParams(max_tokens=20, temperature=0)
SYSTEM = "You are a careful assistant who answers in one short sentence, citing your sources. " * 3


def chat(user: str) -> Request:
    return Request(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                   sampling=GREEDY)


def test_a_prefix_computed_on_one_runner_is_restored_on_another_instead_of_prefilled(make_runner):
    donor = make_runner(FakeBackend(num_slots=2, window=1024, n_batch=64))
    receiver_backend = FakeBackend(num_slots=2, window=1024, n_batch=64)
    receiver = make_runner(receiver_backend)
    assert donor.submit(chat("What is the sea?")).result(timeout=10).ok
    second = chat("Tell me about cats.")
    tokens = receiver.prompt_tokens(second)
    assert receiver.prefix_holding(tokens).num_held == 0

    holding = donor.prefix_holding(tokens, share_more_than=0)
    num_system = holding.num_held
    assert num_system > len(SYSTEM) / 2 and holding.shared is not None
    assert receiver.import_prefix(holding.shared)
    assert receiver.prefix_holding(tokens).num_held == num_system
    result = receiver.submit(second).result(timeout=10)

    plain = make_runner(FakeBackend(num_slots=2, window=1024, n_batch=64)).submit(second).result(timeout=10)
    assert result.ok and result.text == plain.text
    assert result.prompt_tokens_from_ram == result.prompt_tokens_cached == num_system
    assert receiver_backend.restores, "restored from host memory, not prefilled"
    assert receiver.engine.host_cache.stats.num_imported == 1


def test_nothing_is_shared_unless_more_is_held_than_the_asker_has(make_runner):
    donor = make_runner(FakeBackend(num_slots=2, window=1024))
    assert donor.submit(chat("What is the sea?")).result(timeout=10).ok
    tokens = donor.prompt_tokens(chat("Tell me about cats."))
    held = donor.prefix_holding(tokens).num_held
    assert donor.prefix_holding(tokens, share_more_than=held).shared is None
    assert donor.backend.saves == [], "no state was saved for an ask it could not answer"


def test_a_prefix_still_being_prefilled_is_growing_then_shared_from_the_running_slot(make_runner, stepped_engine):
    """A prompt prefilled over several steps: an ask meanwhile learns that more is coming (worth
    waiting for); once the system prompt is in, the running sequence's slot is saved and shared."""
    backend = FakeBackend(num_slots=2, window=1024, n_batch=16)
    donor = stepped_engine(backend, step_tokens=16)
    request_id = donor.submit(chat("What is the sea?"))
    tokens = donor.engine.prompt_tokens(chat("Tell me about cats."))
    donor.step()
    early = donor.engine.prefix_holding(tokens, share_more_than=0)
    assert early.is_growing and early.num_held < early.num_in_flight
    while donor.engine.prefix_holding(tokens).is_growing:
        donor.step()
    holding = donor.engine.prefix_holding(tokens, share_more_than=0)
    assert request_id not in donor.results, "the sequence still runs: its slot is what is shared"
    assert holding.shared is not None and early.num_held < holding.num_held
    assert holding.num_held + MIN_WAIT_TOKENS > early.num_in_flight, "no more worth waiting for"
    assert np.array_equal(holding.shared.tokens[:holding.num_held], np.asarray(tokens[:holding.num_held]))
    donor.run()

    receiver = make_runner(FakeBackend(num_slots=2, window=1024, n_batch=16))
    assert receiver.import_prefix(holding.shared)
    result = receiver.submit(chat("Tell me about cats.")).result(timeout=10)
    plain = make_runner(FakeBackend(num_slots=2, window=1024, n_batch=16)).submit(
        chat("Tell me about cats.")).result(timeout=10)
    assert result.text == plain.text and result.prompt_tokens_from_ram == holding.num_held


def test_a_state_in_host_memory_is_shared_as_it_is():
    cache = HostCache(limit_bytes=10_000)
    state = bytearray(b"saved")
    assert cache.import_shared(SharedPrefix(np.arange(20, dtype=np.int32), state))
    assert not cache.import_shared(SharedPrefix(np.arange(10, dtype=np.int32), bytearray(100))), "already covered"
    assert cache.stats.num_imported == 1 and cache.stats.num_saved == 0
    assert not HostCache(limit_bytes=0).import_shared(SharedPrefix(np.arange(20, dtype=np.int32), state))


def test_a_state_handed_over_as_a_read_only_view_is_kept_as_a_copy():
    """Ray's object store hands arrays over read-only; llama.cpp is given a buffer it may write."""
    view = np.arange(64, dtype=np.uint8)
    view.flags.writeable = False
    cache = HostCache(limit_bytes=10_000)
    assert cache.import_shared(SharedPrefix(np.arange(20, dtype=np.int32), view))
    entry, _ = cache.best_match(np.arange(20, dtype=np.int32))
    assert entry.state.flags.writeable and np.array_equal(entry.state, view)


def test_a_request_queued_but_not_yet_in_a_slot_counts_as_a_prefill_to_come(stepped_engine):
    """Asked right after a request with that prefix arrived (not yet stepped): the asker learns
    that the prefix is coming, and waits for it rather than computing it too."""
    donor = stepped_engine(FakeBackend(num_slots=1, window=1024))
    donor.submit(chat("What is the sea?"))
    holding = donor.engine.prefix_holding(donor.engine.prompt_tokens(chat("Tell me about cats.")))
    assert holding.num_held == 0 and holding.is_growing and holding.num_in_flight > len(SYSTEM) / 2
