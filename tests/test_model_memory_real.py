"""What a model takes loaded, computed before its load (serve --models-memory), checked against
a real load of SmolLM2: the figure bounds what the load adds to the process's resident set, and
a pool sized by default within a budget is the pool the load makes."""

from __future__ import annotations

import pytest

from multiseq.config import KV_POOL_AUTO, RunnerConfig
from multiseq.loading import memory_of, open_backend
from multiseq.server.budget import process_resident_bytes

pytestmark = pytest.mark.model


def test_a_models_share_of_a_budget_bounds_what_its_load_takes_and_names_the_pool_it_makes(smollm):
    room = 400 * 2**20  # less than SmolLM2's trained context in 4 slots takes (8,192 x 4 x 22.5 KiB)
    wanted = RunnerConfig(model=smollm.path, parallel=4, kv_pool=KV_POOL_AUTO, cache_ram_mib=64, threads=2)
    needed, kept, config = memory_of(wanted, room)
    assert isinstance(config.kv_pool, int) and config.kv_pool < 8192 * 4, "sized within the room, not the host"
    assert needed <= room and 0 < kept < 64 * 2**20
    before = process_resident_bytes()
    backend = open_backend(config)
    try:
        added = process_resident_bytes() - before
        assert backend.pool_size == config.kv_pool
        assert 0 < added <= needed, f"the load added {added >> 20} MiB, more than the {needed >> 20} MiB computed"
    finally:
        backend.close()
