"""The KV pool serve makes when given no size: the trained context for every slot, within half
the memory free, and never less than one full session."""

from __future__ import annotations

from multiseq.llama.kv_sizing import MEMORY_SHARE, default_pool

GIB = 2**30


def test_the_pool_holds_every_slot_at_the_trained_context_when_memory_allows():
    pool = default_pool(n_ctx_train=8192, num_slots=8, bytes_per_token=23040, free_bytes=20 * GIB)
    assert (pool.tokens, pool.bounded_by, pool.agent_sessions) == (65536, "the trained context", 9)
    assert pool.num_bytes == 65536 * 23040
    assert pool.session_tokens == 8192, "a session is capped at the trained context, as llama-server caps a slot"


def test_on_a_small_machine_the_pool_takes_half_the_free_memory_in_whole_granules():
    pool = default_pool(n_ctx_train=32768, num_slots=8, bytes_per_token=18432, free_bytes=2 * GIB)
    assert pool.bounded_by == "memory" and pool.tokens % 256 == 0
    assert pool.num_bytes <= 2 * GIB * MEMORY_SHARE < pool.num_bytes + 256 * 18432
    assert pool.session_tokens == 32768 < pool.tokens
    tiny = default_pool(n_ctx_train=32768, num_slots=2, bytes_per_token=18432, free_bytes=64 * 2**20)
    assert tiny.session_tokens == tiny.tokens == 32768


def test_a_pool_never_holds_less_than_one_full_session_nor_more_than_asked():
    assert default_pool(n_ctx_train=32768, num_slots=4, bytes_per_token=18432, free_bytes=64 * 2**20).tokens == 32768
    assert default_pool(n_ctx_train=4096, num_slots=2, bytes_per_token=1000, free_bytes=None).tokens == 8192
