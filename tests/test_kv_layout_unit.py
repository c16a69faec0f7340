"""A pool held in windows while they fit (RunnerConfig.kv_layout "auto"): the saved-state
rewriting that moves a slot between layouts, and when the engine moves them, on fakes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fakes import FakeBackend
from multiseq import Request, SamplingParams
from multiseq.kv.layout_choice import LayoutChoice
from multiseq.kv.pool import CellLedger
from multiseq.llama.batch import BatchEntry
from multiseq.llama.kv_states import StateFormatError, cell_count, num_streams, restreamed


def cells_bytes(positions: list[int], n_layer: int, row: int, v_trans: bool, ext: int, mla: bool, seed: int) -> bytes:
    """One stream's cells as llama.cpp writes them (llama_kv_cache::state_write_meta/_data)."""
    rng = np.random.default_rng(seed)
    out = b"".join(struct.pack("<iI", pos, 1) + bytes(ext) + struct.pack("<i", 3) for pos in positions)
    out += struct.pack("<II", int(v_trans), n_layer)
    count = len(positions)
    for _ in range(n_layer):
        out += struct.pack("<iQ", 1, row) + rng.bytes(count * row)
    if mla:
        return out
    for _ in range(n_layer):
        if v_trans:
            out += struct.pack("<iII", 1, 2, row // 2) + rng.bytes(row // 2 * count * 2)
        else:
            out += struct.pack("<iQ", 1, row) + rng.bytes(count * row)
    return out


def state(streams: int, at: int, positions: list[int], caches: int = 1, **cells) -> np.ndarray:
    """A one-sequence state: per KV cache, `streams` headers with the cells in stream `at`."""
    out = struct.pack("<Ii", 0xAF143CD8, 2)  # llama.cpp's magic and the sequence saved
    for cache in range(caches):
        out += struct.pack("<I", streams)
        for stream in range(streams):
            if stream == at and positions:
                out += struct.pack("<I", len(positions)) + cells_bytes(positions, seed=cache, **cells)
            else:
                out += struct.pack("<I", 0)
    return np.frombuffer(out, dtype=np.uint8).copy()


LAYOUTS = [dict(n_layer=2, row=8, v_trans=False, ext=0, mla=False), dict(n_layer=3, row=6, v_trans=True, ext=0, mla=False),
           dict(n_layer=2, row=8, v_trans=False, ext=12, mla=False), dict(n_layer=2, row=8, v_trans=False, ext=0, mla=True)]


@pytest.mark.parametrize("cells", LAYOUTS, ids=["plain", "v-transposed", "cell-ext", "mla"])
@pytest.mark.parametrize("caches", [1, 2], ids=["one-cache", "sliding-window-too"])
def test_a_windows_state_is_the_pools_state_and_back(cells, caches):
    if cells["mla"] and caches == 2:
        pytest.skip("no model has both")
    positions = list(range(5, 17))
    windows = state(4, 2, positions, caches, **cells)
    pooled = state(1, 0, positions, caches, **cells)
    assert num_streams(windows) == 4 and cell_count(windows) == len(positions)
    assert bytes(restreamed(windows, 1)) == bytes(pooled)
    assert bytes(restreamed(pooled, 4)) == bytes(state(4, 0, positions, caches, **cells))
    assert restreamed(pooled, 1) is pooled, "a state already in the layout is not copied"


def test_an_empty_state_and_bytes_that_are_not_a_state():
    empty = state(3, 0, [])
    assert bytes(restreamed(empty, 1)) == bytes(empty[:8]) + struct.pack("<II", 1, 0)
    with pytest.raises(StateFormatError):
        restreamed(np.frombuffer(bytes(empty[:8]) + b"\x02\x00\x00\x00\x05\x00\x00\x00garbage", np.uint8), 1)
    one = state(1, 0, [0, 1], **LAYOUTS[0])
    cells = bytes(one[16:])
    twice = bytes(one[:8]) + struct.pack("<II", 2, 2) + cells + struct.pack("<I", 2) + cells
    with pytest.raises(StateFormatError):  # cells in two streams: not one sequence's state
        restreamed(np.frombuffer(twice, np.uint8), 1)


class MovingBackend:
    """What LayoutChoice sees of a backend: its window, its layout, and the moves asked."""

    def __init__(self, num_slots: int = 3, window: int = 100) -> None:
        self.num_slots = num_slots
        self.layout_window = window
        self.pooled = False
        self.moves: list[tuple[bool, dict]] = []

    def relayout(self, pooled: bool, shares: dict) -> None:
        self.moves.append((pooled, shares))
        self.pooled = pooled


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entry(slot: int, start: int, count: int = 1) -> BatchEntry:
    return BatchEntry(slot, list(range(count)), start, True)


def test_the_pool_is_taken_at_the_step_a_slot_needs_more_than_its_window_and_left_once_none_has():
    backend, ledger, clock = MovingBackend(), CellLedger(3, 300), Clock()
    choice = LayoutChoice(backend, ledger, dwell_seconds=10, clock=clock)
    ledger.grow(0, 60)
    ledger.share(1, 0, 40)  # slot 1 holds slot 0's first 40 cells
    ledger.grow(1, 70)
    choice.before_decode([entry(0, 60), entry(1, 70)])
    choice.before_decode([entry(0, 99), entry(1, 71)])  # position 99 is the window's last
    assert backend.moves == []
    choice.before_decode([entry(0, 100), entry(1, 72)])
    assert backend.moves == [(True, {1: (0, 40)})], "into the pool, the shared prefix once"
    ledger.grow(0, 101)
    clock.now = 30
    choice.before_decode([entry(1, 73)])
    assert len(backend.moves) == 1, "slot 0 still holds more than a window"
    ledger.cut(0, 50)
    clock.now = 35
    choice.before_decode([entry(1, 74)])
    assert len(backend.moves) == 1, "no slot needed the pool for 5 s only"
    clock.now = 45
    choice.before_decode([entry(1, 75)])
    assert backend.moves[-1] == (False, {}) and choice.num_moves == 2


def test_a_prompt_chunk_past_the_window_or_a_long_restored_state_takes_the_pool_first():
    backend, ledger = MovingBackend(), CellLedger(3, 300)
    choice = LayoutChoice(backend, ledger, clock=Clock())
    choice.before_decode([entry(2, 64, 64)])  # a prompt chunk ending at position 128
    assert backend.moves == [(True, {})]
    backend, ledger = MovingBackend(), CellLedger(3, 300)
    choice = LayoutChoice(backend, ledger, clock=Clock())
    choice.before_restore(state(3, 1, list(range(150)), **LAYOUTS[0]), 20)  # loaded whole, then cut to 20
    assert backend.moves == [(True, {})]


def test_leading_shares_name_the_lowest_slot_with_the_longest_common_front():
    ledger = CellLedger(4, 1000)
    ledger.grow(0, 50)
    ledger.share(1, 0, 30)
    ledger.grow(1, 45)
    ledger.share(2, 1, 40)  # 30 of slot 0's cells, then 10 of slot 1's own
    ledger.grow(3, 20)
    assert ledger.leading_shares() == {1: (0, 30), 2: (1, 40)}


def test_a_runner_moves_its_pool_when_a_prompt_outgrows_a_window_and_says_so(make_runner):
    backend = FakeBackend(num_slots=4, window=2048, n_batch=64, pool_size=2048, windows_while_they_fit=True)
    runner = make_runner(backend, kv_pool=2048)
    greedy = SamplingParams(max_tokens=4, temperature=0)
    [short] = runner.run_batch([Request(prompt="A short one.", sampling=greedy)])
    assert short.ok and backend.layout_moves == [] and runner.snapshot().pool.in_windows
    [long] = runner.run_batch([Request(prompt="x" * 700, sampling=greedy)])  # 701 tokens: past a 512 window
    pool = runner.snapshot().pool
    assert long.ok and backend.layout_moves == [True] and not pool.in_windows and pool.layout_moves == 1
