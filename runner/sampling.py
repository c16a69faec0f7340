"""Logits rows -> tokens for many sequences at once, with numpy.

One decode step yields a (num_outputs, vocab) logits matrix. Greedy rows take an argmax over
the whole matrix in one call. Sampled rows share the costly part, finding the top-k
candidates of a 262k-entry row, as a few vectorized calls over all rows:

  the row is cut into blocks; the k blocks with the largest maxima hold every one of the row's
  k largest values (any value outside them is at most the k-th largest block maximum, and the
  k block maxima themselves are k values at least that large), so an exact top-k only has to
  look at k blocks instead of sorting the whole row.

The rest (top-p, min-p, temperature, the draw) works on k candidates per row. The filters run
in llama.cpp's order, so a request samples from the same distribution it would in llama-server:
repeat penalty, top-k, top-p, min-p, temperature, draw.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from .config import SamplingParams

_MIN_BLOCK = 16
_MAX_BLOCK = 32  # measured: 32-entry blocks are fastest for 16 rows of a 262k vocabulary
# The block trick pays only when the k blocks it keeps are a small share of all blocks.
_BLOCK_SHARE = 4


class SequenceSampler:
    """The sampling state of one sequence: parameters, its own random generator, and the
    recent tokens the repeat penalty looks at. Its draws depend on nothing but its seed and
    its own logits, so a seeded request is reproducible whatever else is in the batch."""

    def __init__(self, params: SamplingParams, seed: int, prompt_tokens: Sequence[int],
                 banned_tokens: Sequence[int] = ()) -> None:
        self.params = params
        self.rng = np.random.Generator(np.random.PCG64(seed))
        # Tokens never to sample, e.g. end-of-generation tokens under ignore_eos (as llama.cpp
        # does it: a -inf bias, so the model keeps writing instead of emitting EOS).
        self.banned = np.asarray(banned_tokens, dtype=np.int64) if len(banned_tokens) else None
        self.recent: deque[int] | None = None
        if params.uses_repeat_penalty:
            self.recent = deque(prompt_tokens[-params.repeat_last_n:], maxlen=params.repeat_last_n)

    def accept(self, token: int) -> None:
        if self.recent is not None:
            self.recent.append(token)


def sample_rows(logits: np.ndarray, samplers: Sequence[SequenceSampler]) -> list[int]:
    """One token for each row of `logits` (rows in the order of `samplers`).

    Rows with a repeat penalty or banned tokens are modified in place (the matrix is scratch
    space owned by the caller until the next decode)."""
    assert logits.shape[0] == len(samplers), "one sampler per logits row"
    for row, sampler in enumerate(samplers):
        if sampler.recent:
            apply_repeat_penalty(logits[row], sampler.recent, sampler.params.repeat_penalty)
        if sampler.banned is not None:
            logits[row, sampler.banned] = -np.inf
    if all(sampler.params.is_greedy for sampler in samplers):
        return logits.argmax(axis=1).tolist()
    tokens = [0] * len(samplers)
    for row, sampler in enumerate(samplers):
        if sampler.params.is_greedy:
            tokens[row] = int(logits[row].argmax())
    for top_k, rows in _sampled_rows_by_top_k(samplers, logits.shape[1]).items():
        matrix = logits if len(rows) == logits.shape[0] else logits[rows]
        ids, values = top_k_sorted(matrix, top_k)
        picks = draw_from_sorted(values, [samplers[row] for row in rows])
        for row, token in zip(rows, ids[np.arange(len(rows)), picks].tolist()):
            tokens[row] = token
    return tokens


def _sampled_rows_by_top_k(samplers: Sequence[SequenceSampler], vocab_size: int) -> dict[int, list[int]]:
    """Sampled rows grouped by k. top_k=0 (disabled) means the whole vocabulary: exact, but a
    full sort of a 262k row costs milliseconds, so such requests sample slower."""
    groups: dict[int, list[int]] = {}
    for row, sampler in enumerate(samplers):
        if not sampler.params.is_greedy:
            top_k = sampler.params.top_k
            groups.setdefault(top_k if 0 < top_k < vocab_size else vocab_size, []).append(row)
    return groups


def apply_repeat_penalty(row: np.ndarray, recent: deque[int], penalty: float) -> None:
    """llama.cpp's repeat penalty: each recently seen token's logit is divided by the penalty
    when positive and multiplied by it when negative."""
    seen = np.unique(np.fromiter(recent, dtype=np.int64, count=len(recent)))
    values = row[seen]
    row[seen] = np.where(values > 0, values / penalty, values * penalty)


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


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def draw_from_sorted(values: np.ndarray, samplers: Sequence[SequenceSampler]) -> np.ndarray:
    """Apply top-p, min-p and temperature to candidates sorted largest first, then draw one
    index per row with each row's own generator."""
    logits = values.astype(np.float64)
    top_p = np.array([s.params.top_p for s in samplers])[:, None]
    min_p = np.array([s.params.min_p for s in samplers])[:, None]
    temperature = np.array([s.params.temperature for s in samplers])[:, None]
    # top-p keeps the smallest prefix whose probability reaches top_p (at least one token).
    cumulative = np.cumsum(_softmax(logits), axis=1)
    keep = np.ones_like(logits, dtype=bool)
    keep[:, 1:] = cumulative[:, :-1] < top_p
    # min-p keeps tokens whose probability is at least min_p times the largest one.
    with np.errstate(divide="ignore"):
        keep &= logits >= logits[:, :1] + np.log(min_p)
    tempered = np.where(keep, logits / temperature, -np.inf)
    cumulative = np.cumsum(_softmax(tempered), axis=1)
    uniform = np.array([s.rng.random() for s in samplers])[:, None] * cumulative[:, -1:]
    picks = (cumulative <= uniform).sum(axis=1)
    # Rounding can put the draw past the last kept candidate: take the last kept one then.
    last_kept = keep.sum(axis=1) - 1
    return np.minimum(picks, last_kept)
