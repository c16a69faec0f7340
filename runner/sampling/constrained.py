"""Exact sampling under a constraint, without masking whole rows.

A constrained request must sample exactly as if its row had been masked first (forbidden
tokens at -inf) and then run through the usual chain. Masking a whole 262k-entry row costs
milliseconds, so the candidates of the masked row are found the cheap way wherever that is
exact, and only the rows where no cheap way is exact pay for a full mask:

- greedy: the row's argmax, when allowed, is also the argmax over the allowed tokens.
- sampled with top-k: when every one of the row's top-k candidates is allowed, they are also
  the masked row's top-k, and the chain over them is unchanged.
- otherwise, when few tokens are allowed: gather just those and take their top-k.
- otherwise: the exact top-M of the row for a larger M, filtered by the mask; when it holds at
  least k allowed tokens and the k-th of them is strictly above the pool's smallest value, no
  allowed token outside the pool can belong to the masked top-k.
- otherwise (rare): mask the whole row.

A row whose allowed tokens all sit at -inf (say, only end-of-generation tokens while those are
banned) keeps the first of them, so that the matcher, not the sampler, decides what follows.
"""

from __future__ import annotations

import numpy as np

from .grammar import allowed_bits, allowed_row, allowed_tokens, num_allowed
from .topk import top_k_sorted

# Up to this many allowed tokens, gathering them is cheaper than any pass over a 262k row.
SPARSE_LIMIT = 4096
# The pool looked at before masking a whole row: POOL_FACTOR times the candidates needed.
POOL_FACTOR = 8
MIN_POOL = 256


def candidates_allowed(bitmask: np.ndarray, ids: np.ndarray) -> bool:
    return bool(allowed_bits(bitmask, ids).all())


def masked_argmax(row: np.ndarray, bitmask: np.ndarray) -> int:
    """argmax of the row with forbidden tokens at -inf (the lowest id among equal maxima, like
    numpy's argmax)."""
    count = num_allowed(bitmask)
    if count == 0:
        return 0  # the matcher allows nothing: it is in error, and accepting the token says so
    if count <= SPARSE_LIMIT:
        ids = allowed_tokens(bitmask)
        return int(ids[np.argmax(row[ids])])
    pool_ids, pool_values = _pool(row, 1)
    allowed = allowed_bits(bitmask, pool_ids)
    if allowed.any():
        best = pool_values[allowed].max()
        if pool_ids.shape[0] == row.shape[0] or best > pool_values[-1]:
            return int(pool_ids[allowed & (pool_values == best)].min())
    masked = np.where(allowed_row(bitmask, row.shape[0]), row, -np.inf)
    token = int(masked.argmax())
    return token if np.isfinite(masked[token]) else int(allowed_tokens(bitmask)[0])


def masked_top_k(row: np.ndarray, bitmask: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top_k largest entries of the row among the allowed tokens, largest first, as
    (ids, values): at most top_k of them, never a forbidden one, at least one."""
    count = num_allowed(bitmask)
    if count == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=row.dtype)
    if count <= SPARSE_LIMIT:
        ids = allowed_tokens(bitmask)
        return _finite_or_first(bitmask, *_largest(ids, row[ids], top_k))
    pool_ids, pool_values = _pool(row, top_k)
    allowed = allowed_bits(bitmask, pool_ids)
    if allowed.sum() >= top_k:
        ids, values = pool_ids[allowed][:top_k], pool_values[allowed][:top_k]
        if pool_ids.shape[0] == row.shape[0] or values[-1] > pool_values[-1]:
            return _finite_or_first(bitmask, ids, values)
    masked = np.where(allowed_row(bitmask, row.shape[0]), row, -np.inf)
    ids, values = top_k_sorted(masked[None, :], min(top_k, count))
    return _finite_or_first(bitmask, ids[0], values[0])


def _pool(row: np.ndarray, needed: int) -> tuple[np.ndarray, np.ndarray]:
    size = min(row.shape[0], max(MIN_POOL, POOL_FACTOR * needed))
    ids, values = top_k_sorted(row[None, :], size)
    return ids[0], values[0]


def _largest(ids: np.ndarray, values: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top_k largest of (ids, values), largest first; equal values in id order."""
    order = np.lexsort((ids, -values))[:top_k]
    return ids[order], values[order]


def _finite_or_first(bitmask: np.ndarray, ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates without their -inf tail (never drawn, and where forbidden and allowed tokens
    tie at -inf the tail may hold forbidden ones); when nothing finite is left, the first
    allowed token alone."""
    finite = np.isfinite(values)
    if finite.any():
        return ids[finite], values[finite]
    return allowed_tokens(bitmask)[:1], np.zeros(1, dtype=values.dtype)


def pad_candidates(ids: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates padded to `width` with -inf entries, which the chain can never draw."""
    padding = width - ids.shape[0]
    if padding <= 0:
        return ids, values
    return (np.concatenate([ids, np.full(padding, ids[0], dtype=ids.dtype)]),
            np.concatenate([values, np.full(padding, -np.inf, dtype=values.dtype)]))
