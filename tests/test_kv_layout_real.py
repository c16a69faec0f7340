"""A KV pool held in a window per slot while every slot fits one, and in one pool from the step
a slot needs more (kv_layout "auto"), on a real model: the slots' KV moves between the layouts
with every position where it was, a prefix two slots share is one set of cells again in the
pool, and a run that moves gives the text of a run held in one pool throughout (up to near
ties: the layouts differ in the last bits, as any change of batch shape does)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import TEST_THREADS
from multiseq import Request, SamplingParams
from multiseq.llama.backend import LlamaBackend
from multiseq.llama.batch import BatchEntry
from test_kv_pool_real import SYSTEM, TICKETS, assert_ledger_matches_the_kv, assert_same_tokens_until_a_near_tie

pytestmark = pytest.mark.model


def next_rows(backend: LlamaBackend, step: list[BatchEntry]) -> np.ndarray:
    """The step's logits rows; the step's tokens are taken out again."""
    rows = np.array(backend.decode(step))
    for entry in step:
        backend.rewind_slot(entry.slot, entry.start_pos)
    return rows


# Slot 1's copy of slot 0's first 100 cells, queued by llama.cpp (another stream), is not made
# when the pool comes: it is made in the pool from slot 0's cells, whether the engine's ledger
# names the share or not.
@pytest.mark.parametrize("shares", [{1: (0, 100)}, {}], ids=["share-named", "share-unnamed"])
def test_every_slot_keeps_its_positions_and_its_next_logits_across_moves(smollm, shares):
    system, other = smollm.tokenize(SYSTEM + TICKETS[0]), smollm.tokenize(TICKETS[2] * 4)
    assert 100 < len(system) < 256 and len(other) < 256
    step = [BatchEntry(0, system[-1:], len(system) - 1, True), BatchEntry(1, system[100:101], 100, True),
            BatchEntry(2, other[-1:], len(other) - 1, True)]
    reference = LlamaBackend(smollm, 3, 256, 512, TEST_THREADS)  # plain windows
    moving = LlamaBackend(smollm, 3, 768, 512, TEST_THREADS, pool_tokens=768, windows_while_they_fit=True)
    try:
        assert moving.layout_window == 256 and not moving.pooled and moving.pool_size == 768
        for backend in (reference, moving):
            backend.decode([BatchEntry(0, system[:-1], 0, False), BatchEntry(2, other[:-1], 0, False)])
            assert backend.reuse_prefix(1, 0, 100)  # another stream's copy: queued until the next decode
        expected = next_rows(reference, step)
        moving.relayout(True, shares)
        assert moving.pooled
        positions = [(moving.slot_pos_min(slot), moving.slot_pos_max(slot)) for slot in range(3)]
        assert positions == [(0, len(system) - 2), (0, 99), (0, len(other) - 2)]
        pooled = next_rows(moving, step)
        moving.relayout(False, {})
        assert not moving.pooled
        assert [(moving.slot_pos_min(slot), moving.slot_pos_max(slot)) for slot in range(3)] == positions
        back = next_rows(moving, step)
    finally:
        reference.close()
        moving.close()
    assert np.array_equal(back, expected), "back in windows: the very cells, the very logits"
    for row, own in zip(pooled, expected):
        assert int(np.argmax(row)) == int(np.argmax(own)) and float(np.abs(row - own).max()) < 0.05


def test_a_run_that_outgrows_the_windows_writes_what_one_pool_writes(smollm, real_runner):
    """Three short prompts fit their windows; a long one then needs the pool, mid-run. (Counting:
    continuations without near ties, so that the comparison has tokens to compare.)"""
    sampling = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=2)
    prompts = ["0 1 0 1 0 1 0 1 0 1", "1, 2, 3, 4, 5, 6, 7, 8,", "5, 6, 7, 8, 9, 10, 11,",
               ", ".join(str(number) for number in range(75)) + ","]  # about 290 tokens: past a window of 256
    requests = [Request(prompt=prompt, id=str(index), sampling=sampling) for index, prompt in enumerate(prompts)]
    long = requests[-1]
    pooled = real_runner(smollm, 4, slot_ctx=None, kv_pool=4 * 256, kv_layout="pool").run_batch(requests)
    moving_runner = real_runner(smollm, 4, slot_ctx=None, kv_pool=4 * 256)
    moving = moving_runner.run_batch(requests)
    layout = moving_runner.engine.backend.layout
    assert len(smollm.tokenize(long.prompt)) > layout.window, "the premise: the long prompt outgrows a window"
    assert layout.num_moves >= 1 and layout.pooled, "the long prompt took the pool"
    assert all(result.ok and result.completion_tokens == 40 for result in moving)
    assert_same_tokens_until_a_near_tie(moving, pooled, at_least=100)
    assert_ledger_matches_the_kv(moving_runner)


def test_a_pool_sized_from_the_machine_caps_a_session_at_the_trained_context(smollm, real_runner):
    """Past its trained context a model writes worse: with no size given, each slot may hold a
    session of the trained context (a window each), not the whole pool."""
    runner = real_runner(smollm, 2, slot_ctx=None, kv_pool="auto", autostart=False)
    assert runner.window == smollm.n_ctx_train == runner.engine.backend.layout.window
    assert runner.engine.backend.pool_size == 2 * smollm.n_ctx_train
