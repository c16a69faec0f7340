"""The step's batch on the way into llama_decode, and its output rows on the way out: plain
numpy and ctypes-free.

multiseq.llama.backend points a llama_batch at the arrays of a `BatchArrays` and fills them from the
step's entries; `rows_in_entry_order` puts the rows of two decodes back in the step's order;
`chunk_rules_for` says where llama.cpp's CPU kernels change with a micro-batch's shape.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .batch import BatchEntry, ChunkRules

_UNTILED_ROWS_BELOW = 64  # GGML_FA_TILE_Q of ggml-cpu's flash attention
_TOKENS_PER_PRODUCT_GROUP = 4  # columns per ggml-cpu repacked GEMM call; the rest go through GEMV


class BatchArrays:
    """The arrays of a llama_batch as numpy buffers; each token belongs to one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.positions = np.zeros(capacity, dtype=np.int32)
        self.num_seq_ids = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.outputs = np.zeros(capacity, dtype=np.int8)
        self.num_tokens = 0
        self.output_indices: list[int] = []  # where each output row's token is in the batch
        # Per entry that embeds: its slot and where its tokens are in the batch.
        self.embedding_spans: list[tuple[int, int, int]] = []
        # (slot, index) -> the model's position of that token, where it is not the index (a
        # model whose images take fewer positions than tokens: multiseq.llama.positions).
        self.position_of: Callable[[int, int], int] | None = None

    def fill(self, entries: list[BatchEntry]) -> int:
        """Write the entries into the arrays; return the number of output rows requested.

        Built as Python lists and copied in with one assignment per array: cheaper than
        several small numpy writes per entry when most entries are a single token."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        output_indices: list[int] = []
        self.embedding_spans = []
        for entry in entries:
            length = len(entry.tokens)
            if entry.embeds:
                self.embedding_spans.append((entry.slot, len(tokens), len(tokens) + length))
            tokens += entry.tokens
            start = entry.start_pos if self.position_of is None else self.position_of(entry.slot, entry.start_pos)
            positions += range(start, start + length)
            seq_ids += [entry.slot] * length
            if entry.wants_output or entry.scores_prompt:
                output_indices += range(len(tokens) - entry.num_outputs, len(tokens))
        count = len(tokens)
        assert count <= self.capacity, "a step never holds more than n_batch tokens"
        self.tokens[:count] = tokens
        self.positions[:count] = positions
        self.seq_ids[:count] = seq_ids
        self.outputs[:count] = 0
        self.outputs[output_indices] = 1
        self.num_tokens = count
        self.output_indices = output_indices
        return len(output_indices)


def rows_in_entry_order(entries: list[BatchEntry], chunk_rows: np.ndarray, token_rows: np.ndarray) -> np.ndarray:
    """One step's output rows from two decodes (its prompt chunks', its decoding tokens'), in
    the order of the entries."""
    rows = np.empty((chunk_rows.shape[0] + token_rows.shape[0], chunk_rows.shape[1]), dtype=np.float32)
    row = chunk_row = token_row = 0
    for entry in entries:
        count = entry.num_outputs
        if entry.is_prompt_chunk:
            rows[row:row + count] = chunk_rows[chunk_row:chunk_row + count]
            chunk_row += count
        else:
            rows[row:row + count] = token_rows[token_row:token_row + count]
            token_row += count
        row += count
    return rows


def chunk_rules_for(batch_invariant: bool) -> ChunkRules:
    """How prompt chunks are cut so that llama.cpp computes a token the same whatever shares
    its micro-batch (exactly so in batch-invariant mode).

    Where llama.cpp's CPU kernels change with the shape of a micro-batch: flash attention
    computes a sequence's rows in tiles once it has 64 of them, and one by one below that;
    without it, only a sequence's lone row is computed differently. Matrix products with
    repacked weights take tokens four at a time, the last ones of a batch one by one.
    A chunk needs one row more than a tile: llama.cpp's split_equal joins consecutive slots
    into one micro-batch, so a chunk beside a decoding slot gives its first token to the
    decode micro-batch, and 64 rows left would fall to 63, computed one by one (at a
    440-token context that costs 4.9 instead of 3.7 ms a token, measured).
    Reused prefixes follow the rules only in batch-invariant mode, where outputs must not
    depend on what was reused. Elsewhere they already depend on the batch's shape, and
    leaving 65 tokens to compute after every reused prefix cost 4x the prompt tokens on
    short chats sharing a system prompt (1,829 computed against llama-server's 459)."""
    return ChunkRules(min_tokens=2 if batch_invariant else _UNTILED_ROWS_BELOW + 1,
                      alignment=_TOKENS_PER_PRODUCT_GROUP, exact_reuse=batch_invariant)
