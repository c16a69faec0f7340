"""Embedding rows out of the step's llama_decode, for the backend (handed the llama_cpp module).

The context is made with pooling "none", and llama.cpp's embedding output is switched on only
for a decode that carries an embedding request's prompt chunk (llama_set_embeddings): then every
token of that decode gets a row, its final hidden state after the output norm, and the engine
pools a request's rows itself over however many steps its prompt takes. llama.cpp's own pooling
sums a sequence within one micro-batch, so a prompt would have to fit one; pooled here it may be
cut like any prompt, and share its steps with decoding streams.

With the output switched on, llama.cpp also computes a logits row for every token (it outputs
every token): the rows the step wanted are picked out of them, so the engine sees what it
would have seen without embeddings.

A reranker's context is made with pooling "rank" and its output always on: llama.cpp pools
each input itself and applies the model's classifier head, which only llama.cpp holds, so an
input is whole in one decode, and its "rows" are one row of its scores (llama_get_embeddings_seq:
n_cls_out values, the first being the relevance score).
"""

from __future__ import annotations

import numpy as np

from .batch_arrays import BatchArrays

# llama_pooling_type's values, as the GGUF's "<arch>.pooling_type" key and --pooling name them.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class EmbeddingOutput:
    """Whether a context's decodes output embeddings, and the rows they gave."""

    def __init__(self, llama, n_embd: int, n_scores: int | None = None) -> None:
        self._llama = llama
        self.n_embd = n_embd
        self.n_scores = n_scores  # a reranker's: the scores per input (None: not a reranker)
        self._is_on = n_scores is not None

    def rebind(self) -> None:
        """A new context starts with its embedding output off (a reranker's: on, as made)."""
        self._is_on = self.n_scores is not None

    def prepare(self, ctx, batch: BatchArrays) -> bool:
        """Switch the output on for a batch with embedding entries (off for one without);
        whether it is on. Every token is marked as an output, as llama.cpp requires then (it
        would mark them itself, warning on every such decode)."""
        wanted = bool(batch.embedding_spans)
        if wanted != self._is_on:
            self._llama.llama_set_embeddings(ctx, wanted)
            self._is_on = wanted
        if wanted:
            batch.outputs[:batch.num_tokens] = 1
        return wanted

    def rows(self, ctx, batch: BatchArrays) -> dict[int, np.ndarray]:
        """Per slot that embeds, a copy of its tokens' rows (the buffer is the next decode's)."""
        if self.n_scores is not None:
            return {slot: self._scores(ctx, slot) for slot, _, _ in batch.embedding_spans}
        pointer = self._llama.llama_get_embeddings(ctx)
        every_row = np.ctypeslib.as_array(pointer, shape=(batch.num_tokens, self.n_embd))
        return {slot: every_row[start:end].copy() for slot, start, end in batch.embedding_spans}

    def _scores(self, ctx, slot: int) -> np.ndarray:
        pointer = self._llama.llama_get_embeddings_seq(ctx, slot)
        return np.ctypeslib.as_array(pointer, shape=(1, self.n_scores)).copy()

    @staticmethod
    def wanted_logits(pointer, batch: BatchArrays, n_vocab: int) -> np.ndarray:
        """The logits rows the step asked for, out of a row for every token."""
        every_row = np.ctypeslib.as_array(pointer, shape=(batch.num_tokens, n_vocab))
        return every_row[batch.output_indices]
