"""The engine: the step loop over one backend, single-threaded, with no locks and no threads.

A step has three phases. The threaded Runner calls them one by one, holding its lock around
the two that change shared state but not around the model call; step() runs all three.

  schedule()  finish cancelled sequences, shift full windows, admit waiting requests, plan
              one batch (a token for every decoding sequence, then prompt chunks)
  execute()   one llama_decode (prompt chunks halved while the KV has no room), then one
              sampling pass over every output row; it changes no scheduling state
  update()    apply the step's output to every sequence: KV accounting, tokens, text, stop
              strings; the only phase that changes a sequence with what the model computed

A sequence decides that it ends (runner.sequence); _retire() is the one place an ending is
applied: the sequence moves to its final status, its slot is freed (its KV kept as a prefix
others may reuse, or cleared) and its result goes out.

The KV side of admitting, preempting, retiring and shifting (slots, and the host-memory tier
they park and restore KV in) is runner.placement's KvPlacement.

What a step produced (text pieces, finished results) waits in an outbox until take_output().
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .batch import Backend
from .config import RunnerConfig
from .errors import BackendError, EngineFailure, NoKvSlot, RequestFault, request_fault
from .grammar import TokenConstraint
from .logprobs import TokenLogprob
from .request import FinishReason, Request, Result
from .tools import Delta
from .graph_sampling import RowSampling
from .sampling import Sampled, SequenceSampler
from .hostcache import HostCache, PrefixHolding, SharedPrefix
from .kvpool import CellLedger, PoolTracking
from .placement import KvPlacement
from .outcome import result_of
from .planning import StepPlan
from .scheduler import Scheduler, fit_prompt
from .sequence import Sequence
from .speculation import Speculator, first_rows, verify_all
from .tools.support import ToolSupport
from .stats import RunnerSnapshot, StatsRecorder, runner_snapshot

logger = logging.getLogger("multiseq.runner")

@dataclass(frozen=True)
class TextPiece:
    """Text a request produced in one step, ready to stream, with the log probabilities of
    the tokens behind it when the request asked for them (a token whose text was held back,
    say as a possible stop string's start, comes with the piece that releases text)."""

    request_id: str
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    # With tools (or a model that reasons): the text parsed into content, reasoning and calls
    # as it streams (runner.tools.types' deltas), text that may begin a call held back; None
    # for a request whose output is plain text.
    deltas: tuple[Delta, ...] | None = None


@dataclass
class StepOutput:
    """What happened since the last take_output(): text pieces in the order they were made,
    then the results of the requests that ended. A request's pieces come before its result."""

    pieces: list[TextPiece] = field(default_factory=list)
    finished: list[Result] = field(default_factory=list)
    num_tokens_decoded: int = 0  # 0: no batch was decoded

    def __bool__(self) -> bool:
        return bool(self.pieces or self.finished or self.num_tokens_decoded)


@dataclass(frozen=True)
class Executed:
    """A decoded and sampled step, not yet applied to its sequences: plain data."""

    plan: StepPlan  # the chunks that ran (prompt chunks may have been halved)
    sampled: list[Sampled | RequestFault]  # one per output sequence of the plan; a fault fails its request
    # Per output sequence, the tokens its draft adds after its sampled one (speculation).
    drafted: list[list[Sampled] | RequestFault]
    failed: list[tuple[Sequence, str]]  # sequences whose decode failed, and why: they ran nothing
    decode_seconds: float  # llama_decode alone
    batch_seconds: float  # filling the batch and retries, outside llama_decode
    sample_seconds: float


@dataclass(frozen=True)
class _Ran:
    """One plan decoded and sampled."""

    plan: StepPlan
    sampled: list[Sampled | RequestFault]
    drafted: list[list[Sampled] | RequestFault]
    decode_seconds: float
    sample_seconds: float


# A decode that fails for one sequence fails that sequence; when it has failed for this many
# sequences (in one step or over several) with none succeeding between them, the backend is at
# fault, not they.
MAX_FAILED_DECODES_IN_A_ROW = 3


class Engine:
    """Continuous batching over one backend with `config.parallel` slots."""

    def __init__(self, config: RunnerConfig, backend: Backend) -> None:
        self.config = config
        # Slots that share one KV pool: its cells are counted here, following every KV operation.
        pool_size = getattr(backend, "pool_size", None)  # a backend made before pools has windows
        self.pool = CellLedger(config.parallel, pool_size) if pool_size else None
        self.backend = backend if self.pool is None else PoolTracking(backend, self.pool)
        self.window = backend.window
        self.host_cache = HostCache(config.cache_ram_mib * 2**20 if config.prefix_cache else 0)
        self.scheduler = Scheduler(config.parallel, config.n_batch, self.window, self._clamped_n_discard(),
                                   prefix_cache=config.prefix_cache, chunk_rules=backend.chunk_rules,
                                   isolate_prefill=config.batch_invariant, host_cache=self.host_cache,
                                   step_tokens=config.step_tokens, pool=self.pool)
        self.stats = StatsRecorder()
        self.placement = KvPlacement(self.backend, self.scheduler, self.host_cache, self.stats)
        self._base_seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._outbox = StepOutput()
        self.tools = ToolSupport(backend.chat_template_source, config.tool_format,
                                 split_reasoning=config.reasoning_format != "none")
        # Control tokens the tool family reads as markers: rendered as text for outputs that
        # go through its parser (and as nothing, llama.cpp's way, everywhere else).
        self._marker_bytes = self.tools.marker_tokens(backend)
        self.row_sampling = RowSampling(config.sampling, backend.graph_sampling)
        self.speculator = (Speculator(config, self.window, stream_per_slot=self.pool is None and config.parallel > 1)
                           if config.spec_type != "none" else None)
        self._num_failed_decodes = 0  # decodes failed since the last one that succeeded

    def _clamped_n_discard(self) -> int:
        n_discard = self.config.n_discard
        if n_discard >= self.window:
            clamped = self.window - 1
            warnings.warn(f"n_discard={n_discard} is not below the {self.window}-token slot window; using {clamped}",
                          stacklevel=4)
            return clamped
        return n_discard

    # --- requests in and out ---------------------------------------------------------------

    def new_sequence(self, request: Request, request_id: str) -> Sequence:
        """Tokenize and fit a request. Reads only the model and the config, so it may run on
        any thread; raises ValueError or BackendError when this request cannot run."""
        params = request.sampling
        text = self.prompt_text(request)
        tokens = self.backend.tokenize(text)
        if not tokens:
            raise ValueError("the prompt tokenizes to no tokens")
        bos_kept = 1 if self.backend.add_bos else 0
        n_keep = (request.n_keep if request.n_keep is not None else self.config.n_keep) + bos_kept
        overflow = request.overflow or self.config.overflow
        fit = fit_prompt(tokens, self.window, n_keep, params.max_tokens, overflow)
        seed = params.seed if params.seed is not None else self._derive_seed(request_id)
        banned = self.backend.end_of_generation_tokens() if params.ignore_eos else ()
        banned_early = self.backend.end_of_generation_tokens() if params.min_tokens and not banned else ()
        sampler = SequenceSampler(params, seed, fit.tokens, banned, self._constraint(request, text),
                                  self.backend.token_bytes, banned_early)
        return Sequence(request_id, fit.tokens, sampler, n_keep, overflow, fit.max_tokens,
                        prompt_tokens_dropped=fit.num_dropped, priority=request.priority,
                        tool_parser=self.tools.parser(request, text))

    def prompt_text(self, request: Request) -> str:
        """A request's prompt as text (its chat rendered with its tools)."""
        return request.prompt if request.prompt is not None else self.tools.render(self.backend, request)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The tokens a request's prompt comes to (its chat rendered with its tools). Reads only
        the model, so it may run on any thread."""
        return self.backend.tokenize(self.prompt_text(request))

    def _constraint(self, request: Request, prompt: str = "") -> TokenConstraint | None:
        """The request's compiled constraint (its schema or grammar, or the grammar of its tool
        calls); raises ValueError when it cannot be compiled (a constrained request never runs
        without its constraint). Token ids of the logit bias are checked here too, where the
        vocabulary is known."""
        params = request.sampling
        too_large = sorted(token for token in params.logit_bias or {} if token >= self.backend.n_vocab)
        if too_large:
            raise ValueError(f"logit_bias names token {too_large[0]}, but the vocabulary has "
                             f"{self.backend.n_vocab} tokens")
        tool_grammar = self.tools.grammar(request, prompt)
        if tool_grammar is not None and params.is_constrained:
            raise ValueError("a JSON schema or grammar cannot constrain an output that may call tools: give "
                             "tool_choice 'none', or leave out the schema")
        if not params.is_constrained and tool_grammar is None:
            return None
        return TokenConstraint(self.backend.grammar_tokenizer(), params, tool_grammar)

    def _derive_seed(self, request_id: str) -> int:
        """A request without a seed gets one from the runner's seed and its id, so a run with a
        fixed runner seed samples the same text for the same id, in any order."""
        digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
        state = np.random.SeedSequence([self._base_seed, int.from_bytes(digest, "little")]).generate_state(2, np.uint32)
        return int(state[0]) | (int(state[1]) << 32)

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
        self.placement.admit(time.perf_counter())
        plan = self.scheduler.plan()
        if self.speculator is not None and plan:
            plan = self.speculator.with_drafts(plan, self.config.n_batch,
                                               self.pool.num_free if self.pool is not None else None)
        self.stats.add_phase("schedule", time.perf_counter() - started)
        return plan

    def clear_prefix_cache(self) -> None:
        """Forget every prefix kept in a free slot (and clear that slot's KV) or in host memory."""
        self.placement.clear()

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
        return Executed(plan_run, sampled, drafted, failed, decode_seconds,
                        time.perf_counter() - started - decode_seconds - sample_seconds, sample_seconds)

    def _run(self, plan: StepPlan) -> _Ran:
        """Decode the plan, halving its prompt chunks while the KV has no room, and sample its
        rows; BackendError when the decode fails."""
        while True:
            try:
                in_graph = self.row_sampling.prepare(plan)
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
        return _Ran(plan, sampled, drafted, self.backend.last_decode_seconds, time.perf_counter() - sampling_started)

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

    def update(self, executed: Executed) -> None:
        """Apply a step's output: every sequence's KV accounting, then its new token; then
        retire the sequences that ended. A sequence cancelled while the step ran keeps the
        KV the step wrote, but its token is dropped. A fault while one sequence's token is
        taken fails that sequence alone."""
        started = time.perf_counter()
        plan = executed.plan
        for seq, error in executed.failed:
            seq.fail(error, overriding=True)  # what its slot holds is in doubt, even if it was cancelled
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
        num_drafts_kept = self._settle_drafts(plan, num_taken)
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

    def _settle_drafts(self, plan: StepPlan, num_taken: dict[Sequence, int]) -> int:
        """The draft positions whose tokens were not taken leave the slot's KV: its newest token
        and the draft tokens that came true stay (the last token taken is decoded next step).
        Returns how many draft tokens came true."""
        num_drafts_kept = 0
        for chunk in plan.chunks:
            num_drafted = chunk.entry.num_drafted
            if not num_drafted:
                continue
            seq = chunk.seq
            num_kept = max(num_taken.get(seq, 0) - 1, 0)
            seq.record_draft(num_drafted, num_kept)
            self.stats.note_draft(num_drafted, num_kept)
            num_drafts_kept += num_kept
            if self.speculator is not None:
                self.speculator.note_verified(seq, num_drafted, num_kept)
            if num_kept < num_drafted and not self.backend.rewind_slot(seq.slot, seq.n_past):
                seq.fail("its KV lost positions while a rejected draft was removed", overriding=True)
        return num_drafts_kept

    def _token_bytes(self, seq: Sequence, token: int) -> bytes:
        if seq.pieces.tool_parser is not None and token in self._marker_bytes:
            return self._marker_bytes[token]
        return self.backend.token_bytes(token)

    def _fail_alone(self, seq: Sequence, fault: RequestFault) -> None:
        """A bug met while handling one request's output: that request fails, no other."""
        logger.error("request %s failed: %s", seq.id, fault, exc_info=fault)
        seq.fail(str(fault), overriding=True)

    def _emit(self, seq: Sequence, text: str, is_last: bool) -> None:
        """Hand out a piece of text (and, with tools, what it parses into). The last piece of a
        request closes its parse, releasing held-back text; a cancelled request's does not
        (nothing is emitted for a request after cancel() returned), and a failed one's parse
        is not asked again (it may be what failed): nothing but the error comes after it."""
        if is_last and seq.ending.reason is FinishReason.ERROR:
            deltas = None if seq.pieces.tool_parser is None else ()
        else:
            deltas = seq.pieces.parse(text, close=is_last and seq.ending.reason is not FinishReason.CANCELLED)
        if text or deltas:
            self._outbox.pieces.append(TextPiece(seq.id, text, seq.pieces.take_unstreamed_logprobs(), deltas))

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
        return self.placement.holding(np.asarray(prompt, dtype=np.int32), share_more_than)

    def import_prefix(self, shared: SharedPrefix) -> bool:
        """Keep another server's prefix KV in host memory: a prompt that starts with it restores
        it, as it restores a state saved here."""
        return self.host_cache.import_shared(shared)

    def snapshot(self, now: float) -> RunnerSnapshot:
        """Every slot and counter at this moment, as plain values (for a dashboard)."""
        return runner_snapshot(self.scheduler, self.stats, self.window, now, self.host_cache)
