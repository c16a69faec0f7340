"""A step's plan decoded and sampled: one llama_decode (prompt chunks halved while the KV has
no room), then one sampling pass over every output row, drafts verified. It changes no
scheduling state; what it gives back (Executed) is applied to the sequences by Engine.update.
A decode that fails is tried again sequence by sequence, so that only the sequences at fault
fail."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ..llama.batch import Backend
from ..errors import BackendError, EngineFailure, NoKvSlot, RequestFault
from .graph_sampling import RowSampling
from .planning import StepPlan
from ..sampling.logprobs import TokenLogprob, prompt_logprobs
from ..sampling.sampler import Sampled
from .sequence import Sequence
from .speculation import first_rows, verify_all

logger = logging.getLogger("multiseq.runner")


@dataclass(frozen=True)
class Executed:
    """A decoded and sampled step, not yet applied to its sequences: plain data."""

    plan: StepPlan  # the chunks that ran (prompt chunks may have been halved)
    sampled: list[Sampled | RequestFault]  # one per output sequence of the plan; a fault fails its request
    # Per output sequence, the tokens its draft adds after its sampled one (speculation).
    drafted: list[list[Sampled] | RequestFault]
    failed: list[tuple[Sequence, str]]  # sequences whose decode failed, and why: they ran nothing
    # Per sequence whose prompt is scored, where its chunk starts in the prompt and the log
    # probabilities of the prompt tokens after each of the chunk's tokens.
    prompt_scores: dict[Sequence, tuple[int, list[TokenLogprob]]]
    # Per embedding request's chunk, where it starts in the prompt and its tokens' embedding rows.
    embeddings: dict[Sequence, tuple[int, np.ndarray]]
    decode_seconds: float  # llama_decode alone
    batch_seconds: float  # filling the batch and retries, outside llama_decode
    sample_seconds: float


@dataclass(frozen=True)
class _Ran:
    """One plan decoded and sampled."""

    plan: StepPlan
    sampled: list[Sampled | RequestFault]
    drafted: list[list[Sampled] | RequestFault]
    prompt_scores: dict[Sequence, tuple[int, list[TokenLogprob]]]
    embeddings: dict[Sequence, tuple[int, np.ndarray]]
    decode_seconds: float
    sample_seconds: float


# A decode that fails for one sequence fails that sequence; when it has failed for this many
# sequences (in one step or over several) with none succeeding between them, the backend is at
# fault, not they.
MAX_FAILED_DECODES_IN_A_ROW = 3


class StepExecution:
    """Decodes and samples plans over one backend, counting decodes that fail in a row."""

    def __init__(self, backend: Backend, row_sampling: RowSampling, switches_adapters: bool = False) -> None:
        self.backend = backend
        self.row_sampling = row_sampling
        self.switches_adapters = switches_adapters  # requests name adapters: each step sets its own
        self._num_failed_decodes = 0  # decodes failed since the last one that succeeded

    def execute(self, plan: StepPlan) -> Executed:
        """llama_decode the plan (on a full KV, halve the prompt chunks and retry), then sample
        every output row. A decode that fails is tried again sequence by sequence, so that only
        the sequences at fault fail; EngineFailure when the backend is at fault (decodes failed
        for MAX_FAILED_DECODES_IN_A_ROW sequences, none succeeding). It changes no scheduling state."""
        started = time.perf_counter()
        try:
            ran = [self._run(plan)]
            failed = []
            self._num_failed_decodes = 0
        except BackendError as error:
            ran, failed = self._run_one_by_one(plan, error)
        decode_seconds = sum(part.decode_seconds for part in ran)
        sample_seconds = sum(part.sample_seconds for part in ran)
        if len(ran) == 1:  # every step but one that failed: its plan and rows as they are
            plan_run, sampled, drafted = ran[0].plan, ran[0].sampled, ran[0].drafted
        else:
            plan_run = StepPlan([chunk for part in ran for chunk in part.plan.chunks])
            sampled = [row for part in ran for row in part.sampled]
            drafted = [tokens for part in ran for tokens in part.drafted]
        prompt_scores = {seq: scores for part in ran for seq, scores in part.prompt_scores.items()}
        embeddings = {seq: rows for part in ran for seq, rows in part.embeddings.items()}
        return Executed(plan_run, sampled, drafted, failed, prompt_scores, embeddings, decode_seconds,
                        time.perf_counter() - started - decode_seconds - sample_seconds, sample_seconds)

    def _run(self, plan: StepPlan) -> _Ran:
        """Decode the plan, halving its prompt chunks while the KV has no room, and sample its
        rows; BackendError when the decode fails."""
        while True:
            try:
                in_graph = self.row_sampling.prepare(plan)
                if self.switches_adapters:
                    self.backend.use_adapter_set(plan.adapter)
                logits = self.backend.decode(plan.entries)
                break
            except NoKvSlot:
                smaller = plan.with_halved_prefill()
                if smaller is None:
                    raise NoKvSlot("llama_decode found no KV room even for one token per sequence") from None
                logger.warning("no KV room for %d tokens; retrying with %d", plan.num_tokens, smaller.num_tokens)
                plan = smaller
        sampling_started = time.perf_counter()
        # Each sequence's next token from its first row, then its draft's rows, if it has one.
        # The logits die with the next decode.
        rows = first_rows(plan)
        sampled = self.row_sampling.sample(logits if rows is None else logits[rows], plan.output_seqs, in_graph)
        drafted = [[] for _ in sampled] if rows is None else verify_all(logits, plan, sampled)
        scores = self._prompt_scores(logits, plan) if rows is not None else {}
        # (the rows of the chunk's place in its prompt: where it starts, applied after the step)
        embeddings = {chunk.seq: (chunk.seq.num_prefilled, self.backend.last_embeddings[chunk.entry.slot])
                      for chunk in plan.chunks if chunk.entry.embeds}
        return _Ran(plan, sampled, drafted, scores, embeddings, self.backend.last_decode_seconds,
                    time.perf_counter() - sampling_started)

    def _prompt_scores(self, logits, plan: StepPlan) -> dict[Sequence, tuple[int, list[TokenLogprob]]]:
        """The log probabilities of the prompt tokens each scored chunk's rows predict: row i
        of a chunk starting at prompt token s gives token s + i + 1's (the chunk's last row
        gives the next chunk's first token's, or, after the prompt's end, the first output's)."""
        scores, row = {}, 0
        for chunk in plan.chunks:
            entry = chunk.entry
            if entry.scores_prompt:
                seq = chunk.seq
                start = seq.num_prefilled  # the chunk's place in the prompt (applied after the step)
                targets = seq.prompt_tokens[start + 1:start + 1 + len(entry.tokens)]
                scores[seq] = start, prompt_logprobs(logits[row:row + len(targets)], targets,
                                                     seq.params.prompt_logprobs, self.backend.token_bytes)
            row += entry.num_outputs
        return scores

    def _run_one_by_one(self, plan: StepPlan, error: BackendError) -> tuple[list[_Ran], list[tuple[Sequence, str]]]:
        """After a failed decode: decode each sequence of the plan alone; the parts that ran,
        and the sequences whose decode failed."""
        ran, failed = [], []
        if len(plan.chunks) == 1:  # nothing to tell apart: that sequence's decode failed
            failed.append((plan.chunks[0].seq, str(error)))
            chunks_alone = []
        else:
            logger.warning("llama_decode failed for %d sequences together (%s): decoding them one by one",
                           len(plan.chunks), error)
            chunks_alone = plan.chunks
        for chunk in chunks_alone:
            try:
                # A failed llama_decode may have kept the micro-batches before the one that
                # failed: the slot goes back to where the step found it.
                if not self.backend.undo_failed_decode(chunk.entry.slot, chunk.entry.start_pos):
                    raise BackendError("its KV was lost with a failed llama_decode")
                ran.append(self._run(StepPlan([chunk])))
            except BackendError as chunk_error:
                failed.append((chunk.seq, str(chunk_error)))
        for seq, why in failed:
            logger.error("request %s: %s", seq.id, why)
        self._num_failed_decodes = 0 if ran else self._num_failed_decodes + len(failed)
        if self._num_failed_decodes >= MAX_FAILED_DECODES_IN_A_ROW:
            raise EngineFailure(f"llama_decode keeps failing, whatever it decodes: {error}")
        return ran, failed
