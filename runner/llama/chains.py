"""Sampler chains inside the model's graph, one per slot (llama_set_sampler): llama.cpp samples
those slots' rows itself, and copies no logits when every row of a micro-batch has a chain.

Imports nothing of llama_cpp: it calls the library multiseq.llama.backend (its only importer) hands
it, on the context it made.
"""

from __future__ import annotations

import ctypes
from types import ModuleType

from .batch import ChainSpec
from .batch_arrays import BatchArrays

_NO_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp would seed from entropy


class SlotChains:
    """The slots' sampler chains (the backend's graph_sampling). The chains are owned here,
    freed once detached."""

    def __init__(self, llama: ModuleType, ctx, batch: BatchArrays, n_vocab: int) -> None:
        self._llama = llama
        self._ctx = ctx
        self._batch = batch
        self._n_vocab = n_vocab
        self._chains: dict[int, object] = {}

    def attach(self, slot: int, spec: ChainSpec, num_accepted: int) -> bool:
        self.detach(slot)
        chain = new_chain(self._llama, spec, num_accepted, self._n_vocab)
        if not self._llama.llama_set_sampler(self._ctx, slot, chain):
            self._llama.llama_sampler_free(chain)
            return False
        self._chains[slot] = chain
        return True

    def detach(self, slot: int) -> None:
        chain = self._chains.pop(slot, None)
        if chain is not None:
            self._llama.llama_set_sampler(self._ctx, slot, None)
            self._llama.llama_sampler_free(chain)

    def unbind(self) -> None:
        """Take the chains off the context (it is about to be freed); they stay owned here."""
        for slot in self._chains:
            self._llama.llama_set_sampler(self._ctx, slot, None)

    def rebind(self, ctx) -> None:
        """Put the chains, as they are (their draws so far), on another context."""
        self._ctx = ctx
        for slot, chain in self._chains.items():
            if not self._llama.llama_set_sampler(ctx, slot, chain):
                raise RuntimeError(f"llama.cpp took no sampler chain for slot {slot} on the new context")

    @property
    def has_chains(self) -> bool:
        return bool(self._chains)

    def sampled_tokens(self, rows: list[int]) -> list[int]:
        indices = self._batch.output_indices
        return [self._llama.llama_get_sampled_token_ith(self._ctx, indices[row]) for row in rows]

    def accept(self, slot: int, token: int) -> None:
        self._llama.llama_sampler_accept(self._chains[slot], token)

    def close(self) -> None:
        for slot in list(self._chains):
            self.detach(slot)


def new_chain(llama: ModuleType, spec: ChainSpec, num_accepted: int, n_vocab: int):
    """llama.cpp's chain for the spec. Its draw is advanced past the tokens already accepted
    (one draw each, as llama.cpp's dist sampler draws once per accepted output), so a
    sequence given a new chain (preempted, then resumed) draws what it would have drawn."""
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    if spec.logit_bias:
        pairs = (llama.llama_logit_bias * len(spec.logit_bias))(*(llama.llama_logit_bias(token, bias)
                                                                  for token, bias in spec.logit_bias))
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_logit_bias(n_vocab, len(spec.logit_bias), pairs))
    if spec.is_greedy:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        return chain
    if spec.top_k > 0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(spec.top_k))
    if spec.top_p < 1.0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(spec.top_p, 1))
    if spec.min_p > 0.0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(spec.min_p, 1))
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(spec.temperature))
    dist = llama.llama_sampler_init_dist(spec.seed if spec.seed != _NO_SEED else 0)
    _advance_draws(llama, dist, num_accepted)
    llama.llama_sampler_chain_add(chain, dist)
    return chain


def _advance_draws(llama: ModuleType, dist, count: int) -> None:
    """Draw `count` times from a dist sampler: applied to a one-token array, it draws once."""
    one = (llama.llama_token_data * 1)(llama.llama_token_data(0, 0.0, 1.0))
    array = llama.llama_token_data_array(one, 1, -1, False)
    for _ in range(count):
        llama.llama_sampler_apply(dist, ctypes.byref(array))
