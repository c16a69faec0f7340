"""The exact k largest entries of each row of a logits matrix, without sorting whole rows.

The row is cut into blocks; the k blocks with the largest maxima hold every one of the row's k
largest values (any value outside them is at most the k-th largest block maximum, and the k
block maxima themselves are k values at least that large), so an exact top-k only has to look
at k blocks instead of sorting a 262k-entry row. Sampling, constrained sampling and logprobs
all use it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_MIN_BLOCK = 16
_MAX_BLOCK = 32  # measured: 32-entry blocks are fastest for 16 rows of a 262k vocabulary
# The block trick pays only when the k blocks it keeps are a small share of all blocks.
_BLOCK_SHARE = 4


def _entries(matrix: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """matrix[row, ids[row]] for every row, as one flat take (half the time of
    take_along_axis's broadcast indexing)."""
    if not matrix.flags.c_contiguous:
        return np.take_along_axis(matrix, ids, axis=1)
    return np.take(matrix, ids + (matrix.shape[1] * np.arange(matrix.shape[0]))[:, None])


def _block_size(vocab_size: int) -> int:
    """The largest power of two up to _MAX_BLOCK that divides the vocabulary (0 if too small)."""
    block = _MAX_BLOCK
    while block >= _MIN_BLOCK:
        if vocab_size % block == 0:
            return block
        block //= 2
    return 0


# Reading a step's logits is bound by memory, and numpy lets go of the GIL while it reduces
# or partitions: rows split over a few threads finish sooner (16 rows of 262k after a decode,
# 2 cores: top-k 1.25 instead of 1.8 ms). Beyond 4 threads memory bandwidth is the limit.
_MAX_THREADS = 4
_MIN_ENTRIES_PER_THREAD = 1 << 20  # below a million logits a thread costs more than it saves
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child the pool's threads are gone: a new pool is made when needed."""
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _thread_count() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_THREADS))


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_thread_count() - 1, thread_name_prefix="multiseq-rows")
        return _pool


def by_row_groups(function: Callable[[np.ndarray], tuple[np.ndarray, ...]],
                  matrix: np.ndarray) -> tuple[np.ndarray, ...]:
    """function(matrix), computed on groups of rows at once in a few threads when the matrix is
    large; `function` must treat each row on its own, so the result is the same either way."""
    parts = min(_thread_count(), matrix.shape[0], max(1, matrix.size // _MIN_ENTRIES_PER_THREAD))
    if parts == 1:
        return function(matrix)
    bounds = np.linspace(0, matrix.shape[0], parts + 1).astype(int)
    futures = [_shared_pool().submit(function, matrix[start:end])
               for start, end in zip(bounds[1:-1], bounds[2:])]
    results = [function(matrix[:bounds[1]])] + [future.result() for future in futures]
    return tuple(np.concatenate(pieces) for pieces in zip(*results))


def top_k_sorted(matrix: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact k largest entries of each row, as (token ids, values), largest first."""
    return by_row_groups(lambda rows: _top_k_sorted(rows, top_k), matrix)


def _top_k_sorted(matrix: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    num_rows, vocab_size = matrix.shape
    block = _block_size(vocab_size)
    num_blocks = vocab_size // block if block else 0
    if block and top_k * _BLOCK_SHARE <= num_blocks:
        # Block b holds the entries b, b + num_blocks, b + 2 * num_blocks, ...: a strided
        # partition, so that the block maxima are an element-wise max over contiguous rows
        # of the (block, num_blocks) view, which numpy vectorizes (a max over short
        # contiguous runs would cost ten times more).
        # fmax, not max: numpy's max checks every pair for NaN and took 1.16 against 0.68 ms
        # for 16 rows after a decode (the same maxima where no logit is NaN).
        block_max = np.fmax.reduce(matrix.reshape(num_rows, block, num_blocks), axis=1)
        top_blocks = np.argpartition(block_max, num_blocks - top_k, axis=1)[:, num_blocks - top_k:]
        pool_ids = (top_blocks[:, None, :] + num_blocks * np.arange(block)[None, :, None]).reshape(num_rows, -1)
        pool = _entries(matrix, pool_ids)
    else:
        pool, pool_ids = matrix, None
    if top_k < pool.shape[1]:
        chosen = np.argpartition(pool, pool.shape[1] - top_k, axis=1)[:, pool.shape[1] - top_k:]
    else:
        chosen = np.broadcast_to(np.arange(pool.shape[1]), pool.shape)
    values = np.take_along_axis(pool, chosen, axis=1)
    ids = chosen if pool_ids is None else np.take_along_axis(pool_ids, chosen, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)
