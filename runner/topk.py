"""The exact k largest entries of each row of a logits matrix, without sorting whole rows.

The row is cut into blocks; the k blocks with the largest maxima hold every one of the row's k
largest values (any value outside them is at most the k-th largest block maximum, and the k
block maxima themselves are k values at least that large), so an exact top-k only has to look
at k blocks instead of sorting a 262k-entry row. Sampling, constrained sampling and logprobs
all use it.
"""

from __future__ import annotations

import numpy as np

_MIN_BLOCK = 16
_MAX_BLOCK = 32  # measured: 32-entry blocks are fastest for 16 rows of a 262k vocabulary
# The block trick pays only when the k blocks it keeps are a small share of all blocks.
_BLOCK_SHARE = 4


def _block_size(vocab_size: int) -> int:
    """The largest power of two up to _MAX_BLOCK that divides the vocabulary (0 if too small)."""
    block = _MAX_BLOCK
    while block >= _MIN_BLOCK:
        if vocab_size % block == 0:
            return block
        block //= 2
    return 0


def top_k_sorted(matrix: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact k largest entries of each row, as (token ids, values), largest first."""
    num_rows, vocab_size = matrix.shape
    block = _block_size(vocab_size)
    num_blocks = vocab_size // block if block else 0
    if block and top_k * _BLOCK_SHARE <= num_blocks:
        # Block b holds the entries b, b + num_blocks, b + 2 * num_blocks, ...: a strided
        # partition, so that the block maxima are an element-wise max over contiguous rows
        # of the (block, num_blocks) view, which numpy vectorizes (a max over short
        # contiguous runs would cost ten times more).
        view = matrix.reshape(num_rows, block, num_blocks)
        block_max = view.max(axis=1)
        top_blocks = np.argpartition(block_max, num_blocks - top_k, axis=1)[:, num_blocks - top_k:]
        pool = np.take_along_axis(view, top_blocks[:, None, :], axis=2).reshape(num_rows, block * top_k)
        pool_ids = (top_blocks[:, None, :] + num_blocks * np.arange(block)[None, :, None]).reshape(num_rows, -1)
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
