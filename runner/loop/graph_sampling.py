"""Which rows of a step llama.cpp samples inside the model's graph (backend sampling), and the
step's tokens gathered from both kinds of rows.

With --sampling backend, a sequence whose sampling a llama.cpp chain can do (a logit bias and
banned tokens, then greedy, or temperature, top-k, top-p, min-p and a seed:
SequenceSampler.chain_spec) has a chain on its slot, and only the chosen token comes back from
the device; llama.cpp copies no logits for a micro-batch whose rows all have chains. The other
sequences (grammars and schemas, penalties, min_tokens, log probabilities) are sampled on the
host by multiseq.sampling.sampler, in the same step. Greedy output is the same on both paths; a seeded sampled request draws from the same
distribution with llama.cpp's generator, and its draws depend only on its seed and how many
tokens it accepted, so it gives the same text twice.

A greedy chain holds no state and stays on its slot from one request to the next; a sampled
one belongs to its sequence. A slot that has no part in a step loses its chain: llama.cpp runs
every attached chain each step, on a dummy row when its slot has no output.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from ..llama.batch import ChainSpec, GraphSampling
from ..config import SamplingMode
from ..errors import BackendError, RequestFault, first_line, request_fault
from .planning import StepPlan
from ..sampling.sampler import Sampled, sample_rows
from .sequence import Sequence

logger = logging.getLogger("multiseq.runner")

_NO_TOKEN = -1  # LLAMA_TOKEN_NULL: the chain sampled nothing for that row


@dataclass(frozen=True)
class _Held:
    """The chain a slot holds: its spec, and the sequence whose draws it carries (None for a
    greedy chain, which any sequence may use)."""

    spec: ChainSpec
    owner: Sequence | None


class RowSampling:
    """Samples a step's output rows: in llama.cpp's graph where the mode and the request
    allow, on the host otherwise."""

    def __init__(self, mode: SamplingMode, graph: GraphSampling | None) -> None:
        self.uses_graph = mode.resolved() is SamplingMode.BACKEND and graph is not None
        self._graph = graph
        self._held: dict[int, _Held] = {}

    @property
    def num_chains(self) -> int:
        return len(self._held)

    def prepare(self, plan: StepPlan) -> list[bool]:
        """Before the decode: give each output row's slot the chain its sequence needs (or
        none); which rows the graph samples, in output order."""
        seqs = plan.output_seqs
        if not self.uses_graph:
            return [False] * len(seqs)
        # A step that verifies drafts, or scores a prompt, has several rows for a sequence: the
        # host samples them all.
        drafting = any(chunk.entry.num_drafted or chunk.entry.scores_prompt for chunk in plan.chunks)
        in_step = set() if drafting else {chunk.seq.slot for chunk in plan.chunks}
        for slot in [slot for slot in self._held if slot not in in_step]:
            self._release(slot)
        return [False] * len(seqs) if drafting else [self._ensure_chain(seq) for seq in seqs]

    def _ensure_chain(self, seq: Sequence) -> bool:
        spec = seq.sampler.chain_spec
        if spec is None:
            self._release(seq.slot)
            return False
        wanted = _Held(spec, None if spec.is_greedy else seq)
        held = self._held.get(seq.slot)
        if held is not None and held.spec == wanted.spec and held.owner is wanted.owner:
            return True
        self._held.pop(seq.slot, None)
        if not self._graph.attach(seq.slot, spec, seq.sampler.num_accepted):
            return False
        self._held[seq.slot] = wanted
        return True

    def _release(self, slot: int) -> None:
        if self._held.pop(slot, None) is not None:
            self._graph.detach(slot)

    def sample(self, logits: np.ndarray, seqs: Seq[Sequence], in_graph: list[bool]) -> list[Sampled | RequestFault]:
        """One token per output row: the graph's where it sampled, the host's for the rest
        (whose logits rows llama.cpp copied). No sequence changes; a sampled chain takes its
        token as accepted (its next draw moves on).

        When sampling the rows together raises, each row is sampled alone, to find the rows at
        fault: theirs is a RequestFault, and every other row gets the token it would have got."""
        try:
            return self._sample_together(logits, seqs, in_graph, list(range(len(seqs))))
        except Exception as error:  # noqa: BLE001 - one row's fault stays with its request
            if len(seqs) == 1:
                return [request_fault("sampling", error)]
            logger.warning("sampling %d rows together failed (%s): sampling them one by one", len(seqs),
                           first_line(error))
        return [self._sample_alone(logits, row, seqs[row], in_graph[row]) for row in range(len(seqs))]

    def _sample_alone(self, logits: np.ndarray, row: int, seq: Sequence, is_graph: bool) -> Sampled | RequestFault:
        try:
            [sampled] = self._sample_together(logits[row:row + 1], [seq], [is_graph], [row])
            return sampled
        except Exception as error:  # noqa: BLE001 - this row's fault is its request's
            return request_fault("sampling", error)

    def _sample_together(self, logits: np.ndarray, seqs: Seq[Sequence], in_graph: list[bool],
                         batch_rows: list[int]) -> list[Sampled]:
        """Sample `seqs`, whose logits are the rows of `logits` and whose rows in the decoded batch
        are `batch_rows` (where the graph's tokens are read)."""
        samplers = [seq.sampler for seq in seqs]
        if not any(in_graph):
            return sample_rows(logits, samplers)
        sampled: list[Sampled | None] = [None] * len(seqs)
        host_rows = [row for row, is_graph in enumerate(in_graph) if not is_graph]
        if host_rows:
            for row, result in zip(host_rows, sample_rows(logits[host_rows], [samplers[row] for row in host_rows])):
                sampled[row] = result
        graph_rows = [row for row, is_graph in enumerate(in_graph) if is_graph]
        tokens = self._graph.sampled_tokens([batch_rows[row] for row in graph_rows])
        for row, token in zip(graph_rows, tokens):
            if token == _NO_TOKEN:
                raise BackendError(f"llama.cpp's sampler chain on slot {seqs[row].slot} chose no token")
        for row, token in zip(graph_rows, tokens):  # accepted only once every row has its token
            slot = seqs[row].slot
            if not self._held[slot].spec.is_greedy:
                self._graph.accept(slot, token)
            sampled[row] = Sampled(token)
        return sampled
