"""One KV pool shared by the slots (llama.cpp's unified KV), on the fake backend: cells counted
as the backend holds them, a shared prefix held once, sessions of any length up to the pool,
admission by free cells, and a full pool that parks sequences instead of aborting them."""

from __future__ import annotations

import random

import pytest

from fakes import FakeBackend
from helpers import run_until_done
from multiseq import Engine, FinishReason, Request, RunnerConfig, SamplingParams
from multiseq.kv.pool import CellLedger

SYSTEM = "You are a careful assistant. " * 6  # 175 bytes: a prefix the sessions share


def pooled(num_slots: int = 4, pool: int = 1024, cache_ram_mib: int = 64, **config) -> tuple[Engine, FakeBackend]:
    backend = FakeBackend(num_slots=num_slots, window=config.get("slot_ctx", pool), n_batch=256, pool_size=pool,
                          state_bytes_per_token=8)
    engine = Engine(RunnerConfig(parallel=num_slots, kv_pool=pool, n_batch=256, threads=1, seed=0,
                                 cache_ram_mib=cache_ram_mib, **config), backend)
    return engine, backend


def windowed(num_slots: int = 4, window: int = 256) -> tuple[Engine, FakeBackend]:
    backend = FakeBackend(num_slots=num_slots, window=window, n_batch=256)
    return Engine(RunnerConfig(parallel=num_slots, slot_ctx=window, n_batch=256, threads=1, seed=0), backend), backend


def submit(engine: Engine, request_id: str, prompt: str, max_tokens: int, **sampling) -> None:
    request = Request(prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                                             **sampling))
    engine.add(engine.new_sequence(request, request_id))


def run_checking_cells(engine: Engine, backend: FakeBackend, max_steps: int = 5000) -> dict:
    """Run to the end, checking after every step that the engine counts the cells the backend
    holds, and that the backend never held more than its pool."""
    def cells_agree() -> None:
        assert engine.pool.num_used == backend.num_cells_used

    return run_until_done(engine, max_steps, cells_agree)


# --- the ledger ---------------------------------------------------------------------------------

def test_a_shared_prefix_is_counted_once_and_its_cells_stay_until_no_slot_holds_them():
    ledger = CellLedger(3, 100)
    ledger.grow(0, 40)
    ledger.share(1, 0, 30)
    ledger.grow(1, 35)
    assert (ledger.num_used, ledger.num_held, ledger.num_reused) == (45, 75, 30)
    assert ledger.only_in(0) == 10 and ledger.only_in(1) == 5
    assert ledger.shared_extent(0) == 30 and ledger.shared_extent(1) == 30
    ledger.cut(0, 0)
    assert ledger.num_used == 35 and ledger.shared_extent(1) == 0, "slot 1 now holds those cells alone"
    ledger.grow(0, 10)
    assert ledger.num_used == 45 and ledger.shared_extent(0) == 0, "new cells, not the ones slot 1 holds"


def test_a_shift_drops_a_slots_own_cells_and_keeps_the_rest_in_order():
    ledger = CellLedger(2, 100)
    ledger.grow(0, 50)
    ledger.share(1, 0, 20)
    ledger.grow(1, 60)
    ledger.drop(1, 20, 15)
    assert ledger.length(1) == 45 and ledger.num_used == 50 + 25
    assert ledger.only_in(1) == 25 and ledger.shared_extent(1) == 20


# --- the engine on a pool -----------------------------------------------------------------------

def test_sessions_sharing_a_system_prompt_hold_it_once_and_answer_as_without_a_pool():
    engine, backend = pooled(num_slots=4, pool=1024)
    for index in range(4):
        submit(engine, f"s{index}", SYSTEM + f"question {index}", max_tokens=20)
    got = run_checking_cells(engine, backend)
    plain, plain_backend = windowed(num_slots=4, window=256)
    for index in range(4):
        submit(plain, f"s{index}", SYSTEM + f"question {index}", max_tokens=20)
    expected = run_until_done(plain)
    assert {key: result.text for key, result in got.items()} == {key: result.text for key, result in expected.items()}
    assert backend.max_cells_used < sum(len(SYSTEM) + 32 for _ in range(4)) - 2 * len(SYSTEM), \
        "the system prompt's cells are held once, not by each slot"
    assert engine.pool.num_reused > 0


def test_one_session_may_grow_to_the_whole_pool_while_the_others_stay_short():
    engine, backend = pooled(num_slots=4, pool=1024)
    submit(engine, "long", "x" * 700, max_tokens=200)
    for index in range(3):
        submit(engine, f"short{index}", f"hi {index}", max_tokens=10)
    results = run_checking_cells(engine, backend)
    assert results["long"].finish_reason is FinishReason.LENGTH and results["long"].completion_tokens == 200
    assert all(results[f"short{index}"].error is None for index in range(3))


def test_a_full_pool_parks_sequences_and_every_request_ends_as_it_would_alone():
    engine, backend = pooled(num_slots=4, pool=600)
    prompts = {f"r{index}": chr(ord("a") + index) * 120 for index in range(6)}
    for request_id, prompt in prompts.items():
        submit(engine, request_id, prompt, max_tokens=150)
    results = run_checking_cells(engine, backend)
    assert engine.stats.num_preempted > 0, "the premise: the pool filled while they decoded"
    for request_id, prompt in prompts.items():
        alone, _ = pooled(num_slots=1, pool=600)
        submit(alone, request_id, prompt, max_tokens=150)
        assert results[request_id].text == run_until_done(alone)[request_id].text
        assert results[request_id].error is None and results[request_id].completion_tokens == 150
    assert backend.max_cells_used <= 600


def test_admission_waits_for_free_cells_instead_of_overfilling_the_pool():
    engine, backend = pooled(num_slots=4, pool=600)
    for index in range(4):
        submit(engine, f"r{index}", chr(ord("k") + index) * 250, max_tokens=20)
    engine.step()
    assert len(engine.scheduler.running) == 2, "two 250-token prompts (and room to grow) fit in 600 cells"
    results = run_checking_cells(engine, backend)
    assert all(result.error is None for result in results.values())


def test_idle_prefixes_leave_the_pool_for_host_memory_and_come_back_from_it():
    engine, backend = pooled(num_slots=4, pool=700)
    submit(engine, "first", SYSTEM + "a first long conversation " * 8, max_tokens=10)
    first = run_checking_cells(engine, backend)["first"]
    for index in range(3):
        submit(engine, f"other{index}", chr(ord("p") + index) * 150, max_tokens=10)
    run_checking_cells(engine, backend)
    assert engine.stats.num_pool_evictions >= 1, "the premise: the idle conversation had to leave"
    submit(engine, "again", SYSTEM + "a first long conversation " * 8 + first.text + " and more", max_tokens=10)
    restores_before = len(backend.restores)
    results = run_checking_cells(engine, backend)
    assert len(backend.restores) > restores_before and results["again"].prompt_tokens_cached > 200


def test_a_slide_keeps_the_cells_another_slot_holds_in_place():
    engine, backend = pooled(num_slots=2, pool=1024, slot_ctx=300, overflow="slide")
    submit(engine, "a", SYSTEM + "one", max_tokens=400)
    submit(engine, "b", SYSTEM + "two", max_tokens=400)
    results = run_checking_cells(engine, backend)  # the fake asserts that no shift moves a shared cell
    assert backend.shifts and all(keep >= 160 for _, keep, _ in backend.shifts)
    assert all(result.completion_tokens == 400 for result in results.values())


def test_without_host_memory_a_full_pool_fails_one_request_naming_why_and_the_rest_finish():
    engine, backend = pooled(num_slots=3, pool=400, cache_ram_mib=0)
    for index in range(3):
        submit(engine, f"r{index}", chr(ord("a") + index) * 50, max_tokens=300)
    results = run_checking_cells(engine, backend)
    failed = [result for result in results.values() if result.error]
    assert failed and all("KV pool" in result.error and "--cache-ram" in result.error for result in failed)
    assert any(result.error is None and result.completion_tokens == 300 for result in results.values())


@pytest.mark.parametrize("seed", range(6))
def test_random_sessions_on_a_small_pool_never_overfill_it_and_all_finish(seed):
    rng = random.Random(seed)
    engine, backend = pooled(num_slots=4, pool=900)
    expected = {}
    for index in range(10):
        prompt = SYSTEM[: rng.choice([0, 60, 175])] + "".join(rng.choice("abcdef") for _ in range(rng.randint(5, 200)))
        max_tokens = rng.randint(1, 250)
        submit(engine, f"r{index}", prompt, max_tokens=max_tokens)
        expected[f"r{index}"] = max_tokens
    results = run_checking_cells(engine, backend)
    assert {key: result.completion_tokens for key, result in results.items()} == expected
    assert backend.max_cells_used <= 900


def test_a_pool_is_refused_with_batch_invariance_saying_why():
    with pytest.raises(ValueError, match="batch_invariant needs a KV window per slot"):
        RunnerConfig(kv_pool=4096, batch_invariant=True)
    assert RunnerConfig(kv_pool=4096).session_ctx == 4096
    assert RunnerConfig(kv_pool=4096, slot_ctx=1024).session_ctx == 1024, "slot_ctx caps a session in a pool"
    assert RunnerConfig().session_ctx == 2048
