"""An embedding request's vector: the rows the backend gives for its prompt's tokens (one per
token, over as many steps as the prompt takes), pooled as the request asks."""

from __future__ import annotations

import numpy as np

from ..config import CONTEXT_POOLINGS, RANK


class PooledEmbedding:
    """The rows of one prompt's tokens, pooled as they arrive (in prompt order; a prompt
    computed again from its start, after a requeue, starts over). `whole`: the prompt must be
    computed in one decode (the backend's embeds_whole); a reranker's (pooling rank) then
    gives one row, the input's scores."""

    def __init__(self, pooling: str, num_tokens: int, whole: bool = False) -> None:
        assert pooling in CONTEXT_POOLINGS, pooling
        self.pooling = pooling
        self.num_tokens = num_tokens
        self.whole = whole or pooling == RANK
        self._sum: np.ndarray | None = None  # mean: the rows' sum, in float64
        self._first: np.ndarray | None = None
        self._last: np.ndarray | None = None
        self._parts: list[np.ndarray] = []  # none: every row
        self.num_rows = 0  # prompt tokens whose rows arrived

    def add(self, start: int, rows: np.ndarray) -> None:
        """The rows of prompt tokens start, start + 1, ..."""
        if self.pooling == RANK:
            assert start == 0, "a reranker's input is scored whole"
            self._last, self.num_rows = rows[0], self.num_tokens
            return
        if start == 0:
            self._sum, self._first, self._parts = None, rows[0], []
        assert start == self.num_rows or start == 0, f"rows for token {start} after {self.num_rows} tokens"
        if self.pooling == "mean":
            chunk_sum = rows.sum(axis=0, dtype=np.float64)
            self._sum = chunk_sum if self._sum is None else self._sum + chunk_sum
        elif self.pooling == "none":
            self._parts.append(rows)
        self._last = rows[-1]
        self.num_rows = start + len(rows)

    @property
    def is_complete(self) -> bool:
        return self.num_rows == self.num_tokens

    def vector(self) -> np.ndarray:
        """The embedding (float32): a vector, or with pooling none a (tokens, width) matrix."""
        assert self.is_complete, "the prompt's rows are not all in"
        if self.pooling == "mean":
            return (self._sum / self.num_rows).astype(np.float32)
        if self.pooling == "cls":
            return np.array(self._first, dtype=np.float32)
        if self.pooling in ("last", RANK):
            return np.array(self._last, dtype=np.float32)
        return np.concatenate(self._parts).astype(np.float32, copy=False)
