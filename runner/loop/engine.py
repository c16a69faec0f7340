"""The engine: the step loop over one backend, single-threaded, with no locks and no threads.

A step has three phases. The threaded Runner calls them one by one, holding its lock around
the two that change shared state but not around the model call; step() runs all three.

  schedule()  finish cancelled sequences, shift full windows, admit waiting requests, plan
              one batch (a token for every decoding sequence, then prompt chunks)
  execute()   one llama_decode (prompt chunks halved while the KV has no room), then one
              sampling pass over every output row; it changes no scheduling state
  update()    apply the step's output to every sequence: KV accounting, tokens, text, stop
              strings; the only phase that changes a sequence with what the model computed

A sequence decides that it ends (multiseq.loop.sequence); _retire() is the one place an ending is
applied: the sequence moves to its final status, its slot is freed (its KV kept as a prefix
others may reuse, or cleared) and its result goes out.

The KV side of admitting, preempting, retiring and shifting (slots, and the host-memory tier
they park and restore KV in) is multiseq.loop.placement's KvPlacement.

What a step produced (text pieces, finished results) waits in an outbox until take_output().
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..llama.batch import Backend
from ..config import RunnerConfig
from ..errors import RequestFault, request_fault
from .execution import Executed, StepExecution
from .graph_sampling import RowSampling
from ..kv.disk import DiskTier, state_key
from ..kv.hostcache import HostCache, PrefixHolding
from ..kv.pool import CellLedger, PoolTracking
from .outcome import result_of
from .placement import KvPlacement
from .planning import StepPlan
from ..request import FinishReason, Request
from ..sampling.sampler import Sampled
from .scheduler import Scheduler
from .sequence import Sequence, scores_prompt
from .sequence_maker import SequenceMaker
from .speculation import Speculator, settle_drafts
from .stats import RunnerSnapshot, StatsRecorder, runner_snapshot
from .step_output import StepOutput, TextPiece
from ..tools.support import ToolSupport

logger = logging.getLogger("multiseq.runner")


class Engine:
    """Continuous batching over one backend with `config.parallel` slots."""

    def __init__(self, config: RunnerConfig, backend: Backend) -> None:
        self.config = config
        # Slots that share one KV pool: its cells are counted here, following every KV operation.
        self.pool = CellLedger(config.parallel, backend.pool_size) if backend.pool_size else None
        self.backend = backend if self.pool is None else PoolTracking(backend, self.pool)
        self.window = backend.window
        self.host_cache = HostCache(config.cache_ram_mib * 2**20 if config.prefix_cache else 0,
                                    _disk_tier(config, backend) if config.prefix_cache else None)
        self.tools = ToolSupport(backend.chat_template_source, config.tool_format,
                                 split_reasoning=config.reasoning_format != "none")
        self.maker = SequenceMaker(config, self.backend, self.tools, self.window)
        self.scheduler = Scheduler(config.parallel, config.n_batch, self.window, self.maker.clamped_n_discard(),
                                   prefix_cache=config.prefix_cache, chunk_rules=backend.chunk_rules,
                                   isolate_prefill=config.batch_invariant, host_cache=self.host_cache,
                                   step_tokens=self.maker.step_tokens, pool=self.pool)
        self.stats = StatsRecorder()
        self.placement = KvPlacement(self.backend, self.scheduler, self.host_cache, self.stats)
        self._outbox = StepOutput()
        # Control tokens the tool family reads as markers: rendered as text for outputs that
        # go through its parser (and as nothing, llama.cpp's way, everywhere else).
        self._marker_bytes = self.tools.marker_tokens(backend)
        self.row_sampling = RowSampling(config.sampling, backend.graph_sampling)
        self.execution = StepExecution(self.backend, self.row_sampling, bool(config.lora_modules))
        self.speculator = (Speculator(config, self.window, stream_per_slot=self.pool is None and config.parallel > 1)
                           if config.spec_type != "none" else None)

    # --- requests in and out ---------------------------------------------------------------

    def new_sequence(self, request: Request, request_id: str, streams: bool = False) -> Sequence:
        """Tokenize and fit a request (multiseq.loop.sequence_maker); may run on any thread."""
        return self.maker.new_sequence(request, request_id, streams)

    def prompt_text(self, request: Request) -> str:
        """A request's prompt as text (its chat rendered with its tools)."""
        return self.maker.prompt_text(request)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The tokens a request's prompt comes to; may run on any thread."""
        return self.maker.prompt_tokens(request)

    def add(self, seq: Sequence) -> None:
        self.stats.note_submit(seq.submitted_at)
        self.scheduler.add(seq)

    def record_rejection(self) -> None:
        """Count a request that failed before it could be queued."""
        self.stats.note_finish(time.perf_counter(), FinishReason.ERROR.value)

    def abort(self, request_id: str) -> bool:
        """Cancel one request: a waiting one ends now with a Cancelled error; a running one
        ends at the next step boundary, keeping its text. False when the id is unknown."""
        seq = self.scheduler.find(request_id)
        if seq is None:
            return False
        seq.request_cancel()
        if seq.is_waiting:
            self._retire(seq)
        return True

    def abort_all(self) -> int:
        """Cancel every waiting and running request at once; returns how many."""
        drained = self.scheduler.drain_waiting()
        running = self.scheduler.running
        for seq in drained + running:
            seq.request_cancel()
        self._retire_ending(drained)
        return len(drained) + len(running)

    def fail_all(self, message: str) -> None:
        """End every waiting and running request with an error (after a bug in the step:
        keeping them could make every later step fail the same way)."""
        seqs = self.scheduler.drain_waiting() + self.scheduler.running
        for seq in seqs:
            seq.fail(message, overriding=True)
        self._retire_ending(seqs)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def take_output(self) -> StepOutput:
        output, self._outbox = self._outbox, StepOutput()
        return output

    # --- the step --------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """Schedule, execute and update one step; what it produced (empty when idle)."""
        plan = self.schedule()
        if plan:
            self.update(self.execute(plan))
        return self.take_output()

    def schedule(self) -> StepPlan:
        started = time.perf_counter()
        self._retire_ending(self.scheduler.running)  # cancelled since the last step
        self._retire_ending(self.placement.shift_full_windows())
        self.placement.preempt(time.perf_counter())
        while ended := self.placement.make_room(time.perf_counter()):  # a shared pool: room for the step
            self._retire_ending(ended)
        self.placement.place_admitted(time.perf_counter())
        plan = self.scheduler.plan()
        if self.speculator is not None and plan:
            plan = self.speculator.with_drafts(plan, self.config.n_batch,
                                               self.pool.num_free if self.pool is not None else None)
        self.stats.add_phase("schedule", time.perf_counter() - started)
        return plan

    def execute(self, plan: StepPlan) -> Executed:
        """llama_decode the plan and sample every output row (multiseq.loop.execution); it changes no
        scheduling state."""
        return self.execution.execute(plan)

    def update(self, executed: Executed) -> None:
        """Apply a step's output: every sequence's KV accounting, then its new token; then
        retire the sequences that ended. A sequence cancelled while the step ran keeps the
        KV the step wrote, but its token is dropped. A fault while one sequence's token is
        taken fails that sequence alone."""
        started = time.perf_counter()
        plan = executed.plan
        for seq, error in executed.failed:
            seq.fail(error, overriding=True)  # what its slot holds is in doubt, even if it was cancelled
        for seq, (start, scores) in executed.prompt_scores.items():  # a prompt computed again overwrites them
            seq.score_prompt(start, scores)
        for seq, (start, rows) in executed.embeddings.items():
            seq.embedding.add(start, rows)
        for chunk in plan.chunks:
            chunk.seq.record_decoded(chunk.num_tokens, chunk.is_prefill, started)
        num_taken = {}  # output tokens each drafting sequence took this step
        for seq, sampled, drafted in zip(plan.output_seqs, executed.sampled, executed.drafted):
            num_before = len(seq.output_tokens)
            if isinstance(sampled, RequestFault):
                self._fail_alone(seq, sampled)
            elif not seq.is_ending:
                self._accept_token(seq, sampled, started)
                self._accept_drafted(seq, drafted, started)
            num_taken[seq] = len(seq.output_tokens) - num_before
        num_drafts_kept = settle_drafts(plan, num_taken, self.backend, self.stats, self.speculator)
        if self.speculator is not None:
            # the decode and the sampling: verifying a draft's rows is host work too
            self.speculator.note_step(plan, executed.decode_seconds + executed.sample_seconds)
        self._retire_ending([chunk.seq for chunk in plan.chunks] + [seq for seq, _ in executed.failed])
        self._outbox.num_tokens_decoded += plan.num_tokens
        if plan.chunks and not plan.num_decode_tokens:  # what prefilling costs, for whether a restore pays
            self.host_cache.costs.note_prefill(plan.num_prefill_tokens, executed.decode_seconds)
        self.stats.record_step(executed.decode_seconds, plan.num_decode_tokens, plan.num_prefill_tokens,
                               len(executed.sampled) + num_drafts_kept)
        self.stats.add_phase("schedule", executed.batch_seconds)
        self.stats.add_phase("decode", executed.decode_seconds)
        self.stats.add_phase("sample", executed.sample_seconds)
        self.stats.add_phase("postprocess", time.perf_counter() - started)

    def _accept_token(self, seq: Sequence, sampled: Sampled, now: float) -> None:
        try:
            token = sampled.token
            self._emit(seq, seq.append_token(sampled, self._token_bytes(seq, token),
                                             self.backend.is_end_of_generation(token), now), is_last=False)
        except Exception as error:  # noqa: BLE001 - one request's failure stays with that request
            self._fail_alone(seq, request_fault("taking its token", error))

    def _accept_drafted(self, seq: Sequence, drafted: list[Sampled] | RequestFault, now: float) -> None:
        """Take the tokens a verified draft added, until one ends the sequence."""
        if isinstance(drafted, RequestFault):
            self._fail_alone(seq, drafted)
            return
        for sampled in drafted:
            if seq.is_ending:
                break
            self._accept_token(seq, sampled, now)

    def _token_bytes(self, seq: Sequence, token: int) -> bytes:
        if seq.pieces.tool_parser is not None and token in self._marker_bytes:
            return self._marker_bytes[token]
        return self.backend.token_bytes(token)

    def _fail_alone(self, seq: Sequence, fault: RequestFault) -> None:
        """A bug met while handling one request's output: that request fails, no other."""
        logger.error("request %s failed: %s", seq.id, fault, exc_info=fault)
        seq.fail(str(fault), overriding=True)

    def _emit(self, seq: Sequence, text: str, is_last: bool) -> None:
        """Hand out a piece of text (and, with tools, its reading: what it parses into, read
        when asked). The last piece of a request closes its reading, releasing held-back text;
        a cancelled request's does not (nothing is emitted for a request after cancel()
        returned), and a failed one's reading is not asked again (it may be what failed):
        nothing but the error comes after it."""
        pieces = seq.pieces
        is_read = pieces.is_read and not (is_last and seq.ending.reason in (FinishReason.ERROR, FinishReason.CANCELLED))
        if text or (is_read and is_last):
            reading = pieces if is_read else None
            self._outbox.pieces.append(TextPiece(seq.id, text, pieces.take_unstreamed_logprobs(), reading,
                                                 len(pieces.text_parts), is_last, **_first_piece_prompt(seq)))

    def _retire_ending(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.is_ending and not seq.is_done:
                self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        """The one place a sequence ends: it moves to its final status (releasing its held
        text), leaves its slot or the queue, its KV stays as a prefix others may reuse (or is
        cleared: after a failure the KV is in doubt, and nothing of it is kept), and its
        result goes into the outbox. A fault while its output is finished or reported fails
        it, and it still leaves its slot and gets its result."""
        slot = seq.slot if seq.is_running else None
        now = time.perf_counter()
        try:
            self._emit(seq, seq.finish(now), is_last=True)
        except Exception as error:  # noqa: BLE001 - one request's failure stays with that request
            self._fail_while_finishing(seq, request_fault("finishing its output", error), now)
        self.placement.release(seq, slot, now)
        try:
            result = result_of(seq)
        except Exception as error:  # noqa: BLE001 - one request's failure stays with that request
            self._fail_while_finishing(seq, request_fault("reporting its result", error), now)
            result = result_of(seq, parse=False)
        self.stats.note_finish(now, seq.ending.reason.value)
        self._outbox.finished.append(result)

    def _fail_while_finishing(self, seq: Sequence, fault: RequestFault, now: float) -> None:
        logger.error("request %s failed: %s", seq.id, fault, exc_info=fault)
        seq.fail_while_finishing(str(fault), now)

    def fail_request(self, request_id: str, message: str) -> bool:
        """Fail one waiting or running request (its output could not be delivered, say): a
        waiting one ends now, a running one at the next step boundary, its KV cleared. False
        when it is not waiting or running."""
        seq = self.scheduler.find(request_id)
        if seq is None or seq.is_done:
            return False
        seq.fail(message, overriding=True)
        if seq.is_waiting:
            self._retire(seq)
        return True

    # --- prefixes shared with other servers of the same model -------------------------------

    def prefix_holding(self, prompt: list[int] | np.ndarray, share_more_than: int | None = None) -> PrefixHolding:
        """How much of `prompt` this engine holds, and (share_more_than) the KV of the longest
        prefix held when it is longer than that, for another server to import."""
        return self.placement.holding(np.asarray(prompt, dtype=np.int64), share_more_than)

    def snapshot(self, now: float) -> RunnerSnapshot:
        """Every slot and counter at this moment, as plain values (for a dashboard)."""
        return runner_snapshot(self.scheduler, self.stats, self.window, now, self.host_cache,
                               self.backend.layout if self.pool is not None else None)


def _first_piece_prompt(seq: Sequence) -> dict:
    """What a sequence's first piece carries of a scored prompt (TextPiece.prompt_first_token
    and prompt_logprobs, so that a stream can echo it first); nothing for later pieces."""
    if not seq.pieces.note_emitted() or not scores_prompt(seq):
        return {}
    return dict(prompt_first_token=seq.sampler.token_bytes(seq.prompt_tokens[0]),
                prompt_logprobs=tuple(seq.prompt_logprobs))


def states_key(config: RunnerConfig, backend: Backend) -> str:
    """What makes a saved KV state valid here, as a key: the model file, the KV types, the
    attention kernels (flash attention lays V out otherwise), the whole-model adapters, and
    batch invariance (other kernels, other numbers)."""
    return state_key(backend.facts.path, config.cache_type_k, config.cache_type_v, config.flash_attn.value,
                     config.batch_invariant, config.lora)


def _disk_tier(config: RunnerConfig, backend: Backend) -> DiskTier | None:
    """The disk tier of --cache-disk (None: off)."""
    if config.cache_disk is None:
        return None
    return DiskTier(config.cache_disk, config.cache_disk_mib * 2**20, states_key(config, backend))
