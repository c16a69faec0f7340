"""Runner: the step loop over one llama.cpp context, its worker thread, and request handles.

Each step: finish cancelled sequences, shift full windows, admit waiting requests into free
slots, plan one batch (a token for every decoding sequence, then prompt chunks), call
llama_decode once, sample every output row in one pass, then append tokens, stream text,
and finish sequences, clearing their KV and freeing their slots at once.

Thread model: one worker thread owns the loop and the model. submit(), cancel() and
cancel_all() may be called from any thread; they touch the scheduler under one lock, which
the loop also holds while it admits, plans and post-processes (never while it decodes).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import numpy as np

from runner.config import RunnerConfig
from runner.errors import BackendError, NoKvSlot
from runner.scheduler import PromptDoesNotFit, Scheduler, StepPlan, fit_prompt
from runner.sequence import FinishReason, Request, Result, Sequence, SequenceStatus, Timings
from runner.sampling import SequenceSampler, sample_rows
from runner.stats import RunnerSnapshot, RunStats, SlotSnapshot, StatsRecorder

logger = logging.getLogger("multiseq.runner")

CANCELLED_BEFORE_START = "Cancelled: the request was cancelled before it started"
_END_OF_STREAM = object()
_IDLE_STEP_SECONDS = 0.001
_TAIL_PIECES = 48  # enough recent pieces to show the end of the text being generated
_TAIL_CHARS = 120


class Backend(Protocol):
    """What the runner needs from a model; runner.backend.LlamaBackend is the real one."""

    num_slots: int
    n_batch: int
    window: int
    n_vocab: int
    can_shift: bool
    add_bos: bool
    last_decode_seconds: float

    def tokenize(self, text: str) -> list[int]: ...
    def render_chat(self, messages: tuple[dict, ...]) -> str: ...
    def token_bytes(self, token: int) -> bytes: ...
    def is_end_of_generation(self, token: int) -> bool: ...
    def end_of_generation_tokens(self) -> list[int]: ...
    def decode(self, entries: list) -> np.ndarray: ...
    def clear_slot(self, slot: int) -> None: ...
    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None: ...
    def close(self) -> None: ...


class RequestHandle:
    """What submit() returns: iterate it for text pieces (when streaming), or wait for result()."""

    def __init__(self, request_id: str, stream: bool, on_finish: Callable[[Result], None] | None = None) -> None:
        self.id = request_id
        self._pieces: queue.SimpleQueue | None = queue.SimpleQueue() if stream else None
        self._done = threading.Event()
        self._result: Result | None = None
        self._on_finish = on_finish

    def emit(self, text: str) -> None:
        if self._pieces is not None and text:
            self._pieces.put(text)

    def finish(self, result: Result) -> None:
        self._result = result
        self._done.set()
        if self._pieces is not None:
            self._pieces.put(_END_OF_STREAM)
        if self._on_finish is not None:
            self._on_finish(result)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Result:
        """The final Result; request failures are in result.error, never raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running after {timeout} s")
        assert self._result is not None
        return self._result

    def __iter__(self) -> Iterator[str]:
        if self._pieces is None:
            raise RuntimeError("submit(request, stream=True) to iterate over text pieces")
        while (piece := self._pieces.get()) is not _END_OF_STREAM:
            yield piece


def _rejected_result(request_id: str, error: str) -> Result:
    """The result of a request that failed before it could even be queued."""
    return Result(id=request_id, text="", finish_reason=FinishReason.ERROR, prompt_tokens=0, completion_tokens=0,
                  timings=Timings(None, None, None, None, 0.0), error=error)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


class Runner:
    """Continuous batching over one llama.cpp context with `config.parallel` slots."""

    def __init__(self, config: RunnerConfig | None = None, backend: Backend | None = None,
                 autostart: bool = True) -> None:
        self.config = config or RunnerConfig()
        self.backend = backend if backend is not None else _open_llama_backend(self.config)
        self.window = self.backend.window
        self.scheduler = Scheduler(self.config.parallel, self.config.n_batch, self.window, self._clamped_n_discard())
        self._stats = StatsRecorder()
        self._lock = threading.Condition()
        self._known_ids: set[str] = set()
        self._num_submitted = 0
        self._base_seed = self.config.seed if self.config.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._autostart = autostart
        self._worker: threading.Thread | None = None
        self._closing = False

    @classmethod
    def on_model(cls, model, config: RunnerConfig, autostart: bool = True) -> Runner:
        """A runner with a new context on an already loaded runner.backend.LlamaModel, which
        it does not free on close: many runners (say, at different parallelism) can share one
        loaded model."""
        return cls(config, backend=_llama_backend(model, config, owns_model=False), autostart=autostart)

    def _clamped_n_discard(self) -> int:
        n_discard = self.config.n_discard
        if n_discard >= self.window:
            clamped = self.window - 1
            warnings.warn(f"n_discard={n_discard} is not below the {self.window}-token slot window; using {clamped}",
                          stacklevel=3)
            return clamped
        return n_discard

    # --- public API ------------------------------------------------------------------------

    def submit(self, request: Request, stream: bool = False,
               on_finish: Callable[[Result], None] | None = None) -> RequestHandle:
        """Queue a request from any thread and return its handle at once.

        stream=True makes the handle iterable over text pieces as they are produced.
        on_finish is called with the Result when the request ends, on the runner's thread
        (keep it short: put the result in a queue, say).
        A request that cannot run (bad prompt, a prompt that cannot fit, a duplicate id) gets
        its error result on the handle right away; nothing else is disturbed."""
        with self._lock:
            if self._closing:
                raise RuntimeError("the runner is closed")
            index = self._num_submitted
            self._num_submitted += 1
            request_id = request.id if request.id is not None else f"req-{index}"
            is_duplicate = request_id in self._known_ids
            if not is_duplicate:
                self._known_ids.add(request_id)
        handle = RequestHandle(request_id, stream, on_finish)
        if is_duplicate:
            self._reject(handle, f"request id {request_id!r} is already waiting or running")
            return handle
        try:
            seq = self._new_sequence(request, request_id, handle)
        except Exception as error:  # noqa: BLE001 - any failure here belongs to this request alone
            with self._lock:
                self._known_ids.discard(request_id)
            self._reject(handle, str(error))
            return handle
        with self._lock:
            self._stats.note_submit(seq.submitted_at)
            self.scheduler.add(seq)
            self._lock.notify_all()
        if self._autostart:
            self._ensure_worker()
        return handle

    def _reject(self, handle: RequestHandle, message: str) -> None:
        """End a request that could not even be queued."""
        with self._lock:
            self._stats.note_finish(time.perf_counter(), FinishReason.ERROR.value)
        handle.finish(_rejected_result(handle.id, message))

    def run_batch(self, requests: Iterable[Request]) -> list[Result]:
        """Run requests to completion and return their results in input order.

        Failed and cancelled requests are results too: check result.ok / result.error. A
        request cancelled before it started has finish_reason "cancelled" and an error, never
        an empty successful answer."""
        with self._lock:  # the loop admits nothing until every request is queued, in order
            handles = [self.submit(request) for request in requests]
        try:
            return [handle.result() for handle in handles]
        except BaseException:
            for handle in handles:
                self.cancel(handle.id)
            raise

    def cancel(self, request_id: str) -> bool:
        """Cancel one request. A waiting one ends with a Cancelled error and never runs; a
        running one stops at the next step boundary, keeping its text, with finish_reason
        "cancelled". Returns False (and logs) when the id is unknown or already finished."""
        with self._lock:
            seq = self.scheduler.find(request_id)
            if seq is None:
                logger.info("cancel(%r): no such waiting or running request", request_id)
                return False
            if seq.status is SequenceStatus.WAITING:
                self.scheduler.remove_waiting(seq)
                self._finish(seq, FinishReason.CANCELLED, error=CANCELLED_BEFORE_START)
            else:
                seq.is_cancel_requested = True
            self._lock.notify_all()
            return True

    def cancel_all(self) -> int:
        """Cancel everything at once: waiting requests are drained with a Cancelled error and
        running ones stop at the next step boundary. No request waiting at the time of the call
        is admitted afterwards; requests submitted after it returns run normally.
        Returns how many requests were cancelled."""
        with self._lock:
            drained = self.scheduler.drain_waiting()
            for seq in drained:
                self._finish(seq, FinishReason.CANCELLED, error=CANCELLED_BEFORE_START)
            running = self.scheduler.running
            for seq in running:
                seq.is_cancel_requested = True
            self._lock.notify_all()
            return len(drained) + len(running)

    def stats(self) -> RunStats:
        with self._lock:
            return self._stats.snapshot()

    def snapshot(self) -> RunnerSnapshot:
        """Every slot and counter at this moment, as plain values (for a dashboard)."""
        now = time.perf_counter()
        with self._lock:
            slots = [self._slot_snapshot(slot, seq, now) for slot, seq in enumerate(self.scheduler.slots)]
            finished = self._stats.finished_by_reason
            return RunnerSnapshot(
                slots=slots,
                num_waiting=len(self.scheduler.waiting),
                num_running=len(self.scheduler.running),
                num_succeeded=finished[FinishReason.STOP.value] + finished[FinishReason.LENGTH.value],
                num_failed=finished[FinishReason.ERROR.value],
                num_cancelled=finished[FinishReason.CANCELLED.value],
                recent_tokens_per_s=self._stats.recent_tokens_per_s(now),
                stats=self._stats.snapshot(),
            )

    def _slot_snapshot(self, slot: int, seq: Sequence | None, now: float) -> SlotSnapshot:
        if seq is None:
            return SlotSnapshot(slot, None, "idle", 0, 0, 0, self.window, None, "", False)
        rate = None
        if seq.first_token_at is not None and now > seq.first_token_at:
            rate = len(seq.output_tokens) / (now - seq.first_token_at)
        return SlotSnapshot(
            slot=slot,
            request_id=seq.id,
            phase=seq.status.value,
            prompt_tokens=len(seq.prompt_tokens),
            generated_tokens=len(seq.output_tokens),
            context_used=seq.n_past,
            window=self.window,
            tokens_per_s=rate,
            text_tail="".join(seq.text_parts[-_TAIL_PIECES:])[-_TAIL_CHARS:],
            is_slid=seq.is_truncated,
        )

    def reset_stats(self) -> None:
        with self._lock:
            self._stats.reset()

    def close(self) -> None:
        """Cancel whatever is left, stop the worker thread and free the model."""
        self.cancel_all()
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._worker is not None:
            self._worker.join()
        while self._has_work():  # without a worker (autostart off), finish the cancellations here
            self.step()
        self.backend.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- the worker ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (submit() does it unless the runner was made with
        autostart=False, which lets a caller queue requests before anything runs)."""
        self._ensure_worker()

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name="multiseq-runner", daemon=True)
                self._worker.start()

    def _has_work(self) -> bool:
        with self._lock:
            return self.scheduler.has_work

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self.scheduler.has_work and not self._closing:
                    self._lock.wait()
                if self._closing and not self.scheduler.has_work:
                    return
            try:
                if not self.step():
                    time.sleep(_IDLE_STEP_SECONDS)  # work exists but none could be planned yet
            except Exception as error:  # noqa: BLE001 - a bug must fail requests, not kill the loop
                logger.exception("runner step failed")
                self._fail_running(f"internal error: {error}")

    def _fail_running(self, message: str) -> None:
        with self._lock:
            for seq in self.scheduler.running:
                self._finish(seq, FinishReason.ERROR, error=message)

    # --- one step --------------------------------------------------------------------------

    def step(self) -> bool:
        """Run one step; False when there was nothing to do."""
        started = time.perf_counter()
        with self._lock:
            self._finish_cancelled()
            self._shift_full_windows()
            self.scheduler.admit(time.perf_counter())
            plan = self.scheduler.plan()
        if not plan:
            return False
        scheduled = time.perf_counter()
        plan, logits = self._decode(plan)
        decoded = time.perf_counter()
        if logits is None:
            return True
        output_seqs = plan.output_seqs
        tokens = sample_rows(logits, [seq.sampler for seq in output_seqs])
        sampled = time.perf_counter()
        with self._lock:
            self._advance(plan)
            for seq, token in zip(output_seqs, tokens):
                if not seq.is_finished:
                    self._accept_token(seq, token, sampled)
            finished = time.perf_counter()
            decode_seconds = self.backend.last_decode_seconds
            self._stats.record_step(decode_seconds, plan.num_decode_tokens, plan.num_prefill_tokens, len(output_seqs))
            self._stats.add_phase("schedule", (scheduled - started) + (decoded - scheduled - decode_seconds))
            self._stats.add_phase("decode", decode_seconds)
            self._stats.add_phase("sample", sampled - decoded)
            self._stats.add_phase("postprocess", finished - sampled)
        return True

    def _decode(self, plan: StepPlan) -> tuple[StepPlan, np.ndarray | None]:
        """llama_decode the plan; on a full KV halve the prompt chunks and retry; on a fatal
        error fail the plan's sequences. Returns the plan that ran and its logits (None when
        nothing was decoded)."""
        while True:
            try:
                return plan, self.backend.decode(plan.entries)
            except NoKvSlot:
                smaller = plan.with_halved_prefill()
                if smaller is None:
                    self._fail_plan(plan, "llama_decode found no KV room even for one token per sequence")
                    return plan, None
                logger.warning("no KV room for %d tokens; retrying with %d", plan.num_tokens, smaller.num_tokens)
                plan = smaller
            except BackendError as error:
                self._fail_plan(plan, str(error))
                return plan, None

    def _fail_plan(self, plan: StepPlan, message: str) -> None:
        with self._lock:
            for entry in plan.entries:
                if not entry.seq.is_finished:
                    self._finish(entry.seq, FinishReason.ERROR, error=message)

    def _advance(self, plan: StepPlan) -> None:
        """Account the tokens the step put into each slot's KV."""
        now = time.perf_counter()
        for entry in plan.entries:
            seq = entry.seq
            seq.n_past += len(entry.tokens)
            if entry.is_prefill:
                seq.num_prefilled += len(entry.tokens)
                if seq.num_prompt_remaining == 0:
                    seq.status = SequenceStatus.DECODING
                    seq.prefilled_at = now
            if seq.is_cancel_requested:
                self._finish(seq, FinishReason.CANCELLED)

    def _accept_token(self, seq: Sequence, token: int, now: float) -> None:
        try:
            seq.sampler.accept(token)
            seq.output_tokens.append(token)
            if seq.first_token_at is None:
                seq.first_token_at = now
            if not seq.params.ignore_eos and self.backend.is_end_of_generation(token):
                self._finish(seq, FinishReason.STOP)
                return
            text, reached_stop = seq.assembler.feed(self.backend.token_bytes(token))
            self._emit(seq, text)
            if reached_stop:
                self._finish(seq, FinishReason.STOP, flush_text=False)
            elif len(seq.output_tokens) >= seq.params.max_tokens:
                self._finish(seq, FinishReason.LENGTH)
        except Exception as error:  # noqa: BLE001 - one request's failure stays with that request
            logger.exception("request %s failed", seq.id)
            self._finish(seq, FinishReason.ERROR, error=f"internal error: {error}")

    def _emit(self, seq: Sequence, text: str) -> None:
        if text:
            seq.text_parts.append(text)
            seq.sink.emit(text)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None, flush_text: bool = True) -> None:
        """End a sequence: flush held text, clear its KV, free its slot, deliver its result."""
        if seq.is_finished:
            return
        if flush_text and seq.status is not SequenceStatus.WAITING:
            self._emit(seq, seq.assembler.flush())
        seq.finish_reason = reason
        seq.error = error
        seq.finished_at = time.perf_counter()
        if seq.slot is not None:
            self.backend.clear_slot(seq.slot)
        self.scheduler.release(seq)
        self._known_ids.discard(seq.id)
        self._stats.note_finish(seq.finished_at, reason.value)
        seq.sink.finish(seq.to_result())

    def _finish_cancelled(self) -> None:
        for seq in self.scheduler.running:
            if seq.is_cancel_requested:
                self._finish(seq, FinishReason.CANCELLED)

    def _shift_full_windows(self) -> None:
        """Slide every decoding sequence whose window is full, or end it where it cannot slide."""
        shifts, stuck = self.scheduler.shifts_needed()
        if not self.backend.can_shift:
            stuck += [shift.seq for shift in shifts]
            shifts = []
        for shift in shifts:
            seq = shift.seq
            self.backend.shift_slot(seq.slot, shift.keep, shift.discard, seq.n_past)
            seq.n_past -= shift.discard
            seq.tokens_shifted_out += shift.discard
        for seq in stuck:
            seq.is_window_exhausted = True
            self._finish(seq, FinishReason.LENGTH)

    # --- building a sequence ---------------------------------------------------------------

    def _new_sequence(self, request: Request, request_id: str, handle: RequestHandle) -> Sequence:
        params = request.sampling
        text = request.prompt if request.prompt is not None else self.backend.render_chat(request.messages)
        tokens = self.backend.tokenize(text)
        if not tokens:
            raise ValueError("the prompt tokenizes to no tokens")
        bos_kept = 1 if self.backend.add_bos else 0
        n_keep = (request.n_keep if request.n_keep is not None else self.config.n_keep) + bos_kept
        overflow = request.overflow or self.config.overflow
        try:
            fit = fit_prompt(tokens, self.window, n_keep, params.max_tokens, overflow)
        except PromptDoesNotFit as error:
            raise ValueError(str(error)) from None
        seed = params.seed if params.seed is not None else self._derive_seed(request_id)
        banned = self.backend.end_of_generation_tokens() if params.ignore_eos else ()
        sampler = SequenceSampler(params, seed, fit.tokens, banned)
        seq = Sequence(request_id, fit.tokens, sampler, handle, n_keep, overflow)
        seq.prompt_tokens_dropped = fit.num_dropped
        return seq

    def _derive_seed(self, request_id: str) -> int:
        """A request without a seed gets one from the runner's seed and its id, so a run with a
        fixed runner seed samples the same text for the same id, in any order."""
        state = np.random.SeedSequence([self._base_seed, _stable_hash(request_id)]).generate_state(2, np.uint32)
        return int(state[0]) | (int(state[1]) << 32)


def _llama_backend(model, config: RunnerConfig, owns_model: bool) -> Backend:
    """A context on a loaded model, sized and threaded as the config says."""
    from runner.backend import LlamaBackend

    return LlamaBackend(model, config.parallel, config.slot_ctx, config.n_batch, config.threads, owns_model=owns_model)


def _open_llama_backend(config: RunnerConfig) -> Backend:
    import models
    from runner.backend import LlamaModel

    resolved = models.resolve(config.model)
    model = LlamaModel(str(resolved.path), config.chat_template, resolved.chat_template_fallback)
    try:
        return _llama_backend(model, config, owns_model=True)
    except BaseException:
        model.close()
        raise
