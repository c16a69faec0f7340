"""Runner: the threaded front end of the engine.

One worker thread owns the engine and the model; it holds the engine lock while it schedules
a step (which may save or restore slots' KV in host memory: slow on a big model) and while it
applies the step's output, but never while llama.cpp decodes.

Other threads talk to it through an inbox, guarded by a small lock of its own that nobody
holds for longer than a list operation: submit() tokenizes on the calling thread and posts the
ready sequence; cancel_soon() and cancel_all_soon() post a cancel and return at once (an event
loop may call them). The worker drains the inbox before it schedules a step and before it
applies a step's output. The blocking cancel() and cancel_all() take the engine lock instead,
so a cancel lands either before a step is scheduled or before its output is applied, and in
both cases nothing more is emitted for that request once cancel() returns.

What readers that must never wait want (the queue's length, the slots, the totals) the worker
publishes: num_waiting is kept under the inbox lock, and latest_snapshot is an immutable
RunnerSnapshot swapped in after a step at most every PUBLISH_INTERVAL_S (building one costs
about 0.3 ms at 64 slots, too much for every step of a small model) and whenever the engine
falls idle. Delivery listeners hear once per batch of on_piece/on_finish calls, so a server can
hand a whole step's output to its event loop in one call.

Anything that changes the backend's KV (clearing the prefix cache, say) must not run while
llama_decode does: such a call is queued as a command, and the thread that steps the engine
runs it between two steps; the caller waits until it ran.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .batch import Backend
from .config import RunnerConfig
from .errors import BackendError
from .engine import Engine, StepOutput, TextPiece
from .request import Request, Result
from .scheduler import PromptDoesNotFit
from .sequence import Sequence
from .stats import RunnerSnapshot, RunStats

logger = logging.getLogger("multiseq.runner")

_END_OF_STREAM = object()
_IDLE_STEP_SECONDS = 0.001
# latest_snapshot is at most this old while requests run (and exact once the engine is idle).
PUBLISH_INTERVAL_S = 0.025


@dataclass(frozen=True)
class _Enqueue:
    """Inbox: a tokenized request for the engine's queue (cancelled: it ends as soon as queued)."""

    seq: Sequence
    is_cancelled: bool


@dataclass(frozen=True)
class _Cancel:
    """Inbox: cancel one request."""

    request_id: str


@dataclass(frozen=True)
class _CancelAll:
    """Inbox: cancel every request queued or running (those posted after it run normally)."""


_Message = _Enqueue | _Cancel | _CancelAll


class _Command:
    """Work for the stepping thread, run between two steps; the caller waits for its value."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.work()
        except BaseException as error:  # noqa: BLE001 - handed back to the caller, raised there
            self.error = error
        finally:
            self.done.set()

    def outcome(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class RequestHandle:
    """What submit() returns: iterate it for text pieces (when streaming), or wait for result()."""

    def __init__(self, request_id: str, stream: bool, on_finish: Callable[[Result], None] | None = None,
                 on_piece: Callable[[TextPiece], None] | None = None) -> None:
        self.id = request_id
        self._pieces: queue.SimpleQueue | None = queue.SimpleQueue() if stream else None
        self._done = threading.Event()
        self._result: Result | None = None
        self._on_finish = on_finish
        self._on_piece = on_piece

    def emit(self, piece: TextPiece) -> None:
        if self._pieces is not None and piece.text:
            self._pieces.put(piece.text)
        if self._on_piece is not None:
            self._on_piece(piece)

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


class Runner:
    """Continuous batching over one llama.cpp context with `config.parallel` slots, driven by
    a worker thread; usable from any thread."""

    def __init__(self, config: RunnerConfig | None = None, backend: Backend | None = None,
                 autostart: bool = True) -> None:
        self.config = config or RunnerConfig()
        self.engine = Engine(self.config, backend if backend is not None else _open_llama_backend(self.config))
        # The engine lock: held by whoever touches the engine (the worker while it schedules and
        # applies a step, a blocking cancel, snapshot()); never by anything an event loop calls.
        self._lock = threading.RLock()
        self._step_lock = threading.Lock()  # held by whoever runs a step (the worker, or a step() caller)
        # The inbox lock, held for list operations only; its condition wakes the idle worker.
        self._wake = threading.Condition(threading.Lock())
        self._inbox: deque[_Message] = deque()  # what the worker applies before its next step
        self._commands: deque[_Command] = deque()  # backend work for the stepping thread
        self._handles: dict[str, RequestHandle] = {}  # every request waiting or running, by id
        # Requests submit() is still tokenizing: known by id, not yet in the engine, and the
        # ones among them a cancel reached meanwhile (they end as soon as they are queued).
        self._tokenizing: set[str] = set()
        self._cancelled_while_tokenizing: set[str] = set()
        # The engine's waiting queue and whether it has work, as of the last change to them
        # (under the inbox lock: the worker reads them while another thread may hold the engine).
        self._num_queued = 0
        self._has_engine_work = False
        self._num_submitted = 0
        self._delivery_listeners: list[Callable[[], None]] = []
        self._autostart = autostart
        self._worker: threading.Thread | None = None
        self._closing = False
        self._closed = False
        self._latest_snapshot = self.engine.snapshot(time.perf_counter())
        self._published_at = time.perf_counter()

    @classmethod
    def on_model(cls, model, config: RunnerConfig, autostart: bool = True) -> Runner:
        """A runner with a new context on an already loaded runner.backend.LlamaModel, which
        it does not free on close: many runners (say, at different parallelism) can share one
        loaded model. The model stays where it was loaded: the config's n_gpu_layers, main_gpu,
        split_mode and tensor_split are the model's business, not the context's."""
        return cls(config, backend=_llama_backend(model, config, owns_model=False), autostart=autostart)

    @property
    def backend(self) -> Backend:
        return self.engine.backend

    @property
    def window(self) -> int:
        """The per-slot window in tokens (prompt plus generation) that the runner enforces."""
        return self.engine.window

    @property
    def allocated_window(self) -> int:
        """The per-slot window llama.cpp allocated (it rounds up), where the backend has one."""
        return getattr(self.backend, "allocated_window", self.window)

    @property
    def device(self) -> str | None:
        """Where the model runs, as llama.cpp placed it ("CPU (...)", or GPUs and their layers);
        None when the backend does not say."""
        return getattr(self.backend, "device", None)

    # --- public API ------------------------------------------------------------------------

    def submit(self, request: Request, stream: bool = False, on_finish: Callable[[Result], None] | None = None,
               on_piece: Callable[[TextPiece], None] | None = None) -> RequestHandle:
        """Queue a request from any thread and return its handle at once.

        stream=True makes the handle iterable over text pieces as they are produced.
        on_piece is called with each TextPiece (text, and its tokens' logprobs when asked) and
        on_finish with the Result when the request ends, both on the runner's thread and in
        order: keep them short (put what they get in a queue, or hand it to an event loop
        with loop.call_soon_threadsafe, or collect them and hand them over from a delivery
        listener: see add_delivery_listener).
        A request that cannot run (bad prompt, a prompt that cannot fit, a duplicate id) gets
        its error result on the handle right away; nothing else is disturbed. Tokenizing runs
        on the calling thread and never waits for a step."""
        with self._wake:
            if self._closing:
                raise RuntimeError("the runner is closed")
            request_id = request.id if request.id is not None else f"req-{self._num_submitted}"
            self._num_submitted += 1
            handle = RequestHandle(request_id, stream, on_finish, on_piece)
            is_duplicate = request_id in self._handles
            if not is_duplicate:
                self._handles[request_id] = handle
                self._tokenizing.add(request_id)
        if is_duplicate:
            self._reject(handle, f"request id {request_id!r} is already waiting or running")
            return handle
        # Tokenizing, rendering a chat and compiling a constraint read only the model and the
        # config, and take a while: steps and other requests go on meanwhile. A cancel, a
        # cancel_all or a close that comes now is noted, and applied once the request is queued.
        try:
            seq = self.engine.new_sequence(request, request_id)
        except Exception as error:  # noqa: BLE001 - any failure here belongs to this request alone
            with self._wake:
                self._stop_tokenizing(request_id)
                del self._handles[request_id]
            self._reject(handle, error)
            return handle
        with self._wake:
            was_cancelled = self._stop_tokenizing(request_id) or self._closing
            self._inbox.append(_Enqueue(seq, was_cancelled))
            self._wake.notify_all()
            has_worker = self._worker is not None
        if not has_worker:  # no worker drains the inbox: queue it now (a step() may be running)
            with self._lock:
                self._apply_inbox()
        if self._autostart:
            self._ensure_worker()
        return handle

    def _stop_tokenizing(self, request_id: str) -> bool:
        """The request is tokenized (or failed to be); whether a cancel reached it meanwhile.
        Called under the inbox lock."""
        self._tokenizing.discard(request_id)
        if request_id in self._cancelled_while_tokenizing:
            self._cancelled_while_tokenizing.discard(request_id)
            return True
        return False

    def _reject(self, handle: RequestHandle, error: str | Exception) -> None:
        """End a request that could not even be queued. What the request asked for
        (ValueError) or what the model cannot do with it (BackendError) is the caller's error,
        said as is; anything else is a bug, logged, and said as one."""
        with self._lock:  # the engine's counters belong to whoever holds its lock
            self.engine.record_rejection()
        if isinstance(error, PromptDoesNotFit):
            handle.finish(Result.rejected(handle.id, str(error), prompt_tokens=error.num_prompt))
        elif isinstance(error, (str, ValueError, BackendError)):
            handle.finish(Result.rejected(handle.id, str(error)))
        else:
            logger.error("request %s could not be queued", handle.id, exc_info=error)
            handle.finish(Result.failed_before_start(handle.id, f"internal error: {type(error).__name__}"))
        self._tell_delivery_listeners()

    def count_prompt_tokens(self, request: Request) -> int:
        """How many tokens the request's prompt comes to (a chat rendered with its tools), without
        running it; ValueError or BackendError when it cannot be rendered. Any thread."""
        return len(self.engine.prompt_tokens(request))

    def run_batch(self, requests: Iterable[Request]) -> list[Result]:
        """Run requests to completion and return their results in input order.

        Failed and cancelled requests are results too: check result.ok / result.error. A
        request cancelled before it started has finish_reason "cancelled" and an error, never
        an empty successful answer."""
        with self._lock:  # the worker admits nothing until every request is queued, in order
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
        "cancelled". Nothing more is emitted for it once this returns, which may mean waiting
        for the step being scheduled (an event loop calls cancel_soon instead). Returns False
        (and logs) when the id is unknown or already finished."""
        with self._wake:
            if request_id in self._tokenizing:
                self._cancelled_while_tokenizing.add(request_id)
                return True
        with self._lock:
            self._apply_inbox()  # a request posted but not yet queued is in the engine first
            found = self.engine.abort(request_id)
            self._note_engine_state()
            self._deliver(self.engine.take_output())
            self._publish(time.perf_counter())
        if not found:
            logger.info("cancel(%r): no such waiting or running request", request_id)
        return found

    def cancel_soon(self, request_id: str) -> bool:
        """Cancel one request as cancel() does, without waiting: the worker applies it before
        its next step (or before it applies the step running now), so a piece or two may still
        come. Safe on an event loop. Returns whether the request was known (waiting, running,
        or being tokenized)."""
        with self._wake:
            if request_id in self._tokenizing:
                self._cancelled_while_tokenizing.add(request_id)
            else:
                self._inbox.append(_Cancel(request_id))
            self._wake.notify_all()
            return request_id in self._handles

    def cancel_all(self) -> int:
        """Cancel everything at once: waiting requests are drained with a Cancelled error and
        running ones stop at the next step boundary. No request waiting at the time of the call
        is admitted afterwards; requests submitted after it returns run normally.
        Returns how many requests were cancelled."""
        with self._lock:
            with self._wake:
                num_tokenizing = len(self._tokenizing - self._cancelled_while_tokenizing)
                self._cancelled_while_tokenizing |= self._tokenizing
            self._apply_inbox()
            count = self.engine.abort_all() + num_tokenizing
            self._note_engine_state()
            self._deliver(self.engine.take_output())
            self._publish(time.perf_counter())
            return count

    def cancel_all_soon(self) -> None:
        """cancel_all() without waiting (safe on an event loop): the worker applies it before
        its next step; requests submitted after this call run normally."""
        with self._wake:
            self._cancelled_while_tokenizing |= self._tokenizing
            self._inbox.append(_CancelAll())
            self._wake.notify_all()

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet in a slot (being tokenized, posted, or queued). Never
        waits for a step."""
        with self._wake:
            num_posted = sum(isinstance(message, _Enqueue) for message in self._inbox)
            return self._num_queued + num_posted + len(self._tokenizing)

    def stats(self) -> RunStats:
        """The totals at this moment (may wait for the step being scheduled; latest_snapshot.stats
        never waits)."""
        with self._lock:
            return self.engine.stats.snapshot()

    def snapshot(self) -> RunnerSnapshot:
        """Every slot and counter at this moment, as plain values (may wait for the step being
        scheduled; latest_snapshot never waits)."""
        with self._lock:
            return self.engine.snapshot(time.perf_counter())

    @property
    def latest_snapshot(self) -> RunnerSnapshot:
        """The snapshot the worker published last: at most PUBLISH_INTERVAL_S (plus a step)
        old while requests run, exact once the engine is idle. Never waits: for an event loop."""
        return self._latest_snapshot

    def add_delivery_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each batch of on_piece/on_finish calls (one batch per step,
        or per cancel or rejection), on the thread that made them: a consumer that collects
        what its callbacks get can hand the whole batch over at once."""
        with self._wake:
            self._delivery_listeners = [*self._delivery_listeners, listener]

    def remove_delivery_listener(self, listener: Callable[[], None]) -> None:
        with self._wake:
            self._delivery_listeners = [known for known in self._delivery_listeners if known is not listener]

    def clear_prefix_cache(self) -> None:
        """Forget the prompt prefixes kept in idle slots and clear their KV; returns once done
        (between two steps: never while a decode runs)."""
        self.between_steps(self.engine.clear_prefix_cache)

    def between_steps(self, work: Callable[[], Any]) -> Any:
        """Run `work` (which may use the engine and its backend) on the thread that steps the
        engine, between two steps, and return its value (or raise its exception). Without a
        worker thread it runs here, once no step() in another thread is running."""
        command = _Command(work)
        if threading.current_thread() is self._worker:  # it would wait for itself
            raise RuntimeError("the runner's own thread (an on_finish callback) cannot wait for a step to end")
        with self._wake:
            if self._closing:
                raise RuntimeError("the runner is closed")
            self._commands.append(command)
            self._wake.notify_all()
            has_worker = self._worker is not None
        if not has_worker:
            with self._step_lock:
                self._run_commands()
        return command.outcome()

    def _run_commands(self) -> None:
        """Run the queued commands (on the stepping thread, holding the step lock)."""
        with self._lock:
            with self._wake:
                commands, self._commands = self._commands, deque()
            for command in commands:
                command.run()
            self._deliver(self.engine.take_output())

    def reset_stats(self) -> None:
        with self._lock:
            self.engine.stats.reset()

    def close(self) -> None:
        """Cancel whatever is left, stop the worker thread and free the model. Idempotent."""
        if self._closed:
            return
        self.cancel_all()
        with self._wake:
            self._closing = True
            self._wake.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join()
        while self._has_work():  # without a worker (autostart off), finish the cancellations here
            self.step()
        self.backend.close()
        self._closed = True

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- the worker ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (submit() does it unless the runner was made with
        autostart=False, which lets a caller queue requests, or call step(), before anything runs)."""
        self._ensure_worker()

    def _ensure_worker(self) -> None:
        with self._wake:
            # A submit that was tokenizing while close() ran must not start a worker afterwards.
            if self._worker is None and not self._closing:
                self._worker = threading.Thread(target=self._loop, name="multiseq-runner", daemon=True)
                self._worker.start()

    def _has_work(self) -> bool:
        with self._lock, self._wake:
            return self.engine.has_work or bool(self._commands) or bool(self._inbox)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._has_engine_work or self._inbox or self._commands or self._closing):
                    self._wake.wait()
                if self._closing and not (self._has_engine_work or self._inbox or self._commands):
                    return
            try:
                if not self.step():
                    time.sleep(_IDLE_STEP_SECONDS)  # work exists but none could be planned yet
            except Exception as error:  # noqa: BLE001 - a bug must fail requests, not kill the loop
                logger.exception("runner step failed")
                with self._lock:
                    self.engine.fail_all(f"internal error: {error}")
                    self._note_engine_state()
                    self._deliver(self.engine.take_output())
                    self._publish(time.perf_counter(), force=True)

    def step(self) -> bool:
        """Apply the inbox and run the queued commands, then one step of the engine, and deliver
        what it produced; False when there was nothing to decode. The worker calls this;
        without a worker, a caller may."""
        with self._step_lock:
            self._run_commands()
            with self._lock:
                self._apply_inbox()
                plan = self.engine.schedule()
                self._note_engine_state()
                self._deliver(self.engine.take_output())
                if not plan:
                    self._publish(time.perf_counter())
                    return False
            executed = self.engine.execute(plan)  # llama_decode and sampling, without the lock
            with self._lock:
                self._apply_inbox()  # cancels that came during the decode drop its tokens
                self.engine.update(executed)
                self._note_engine_state()
                self._publish(time.perf_counter())  # before the results: readers see them counted
                self._deliver(self.engine.take_output())
            return True

    def _apply_inbox(self) -> None:
        """Apply what was posted, in order (under the engine lock). The queue's length changes
        under the inbox lock too, so num_waiting never misses a request between the two."""
        with self._wake:
            messages, self._inbox = self._inbox, deque()
            for message in messages:
                if isinstance(message, _Enqueue):
                    self.engine.add(message.seq)
                    if message.is_cancelled:
                        self.engine.abort(message.seq.id)  # a waiting request: it ends here, never runs
                elif isinstance(message, _Cancel):
                    if not self.engine.abort(message.request_id):
                        logger.info("cancel(%r): no such waiting or running request", message.request_id)
                else:
                    self.engine.abort_all()
            self._num_queued, self._has_engine_work = len(self.engine.scheduler.waiting), self.engine.has_work
        if messages:
            self._deliver(self.engine.take_output())

    def _note_engine_state(self) -> None:
        """The engine's queue or slots changed (under the engine lock): num_waiting and the
        worker's idea of whether work is left follow."""
        num_queued, has_work = len(self.engine.scheduler.waiting), self.engine.has_work
        with self._wake:
            self._num_queued, self._has_engine_work = num_queued, has_work

    def _publish(self, now: float, force: bool = False) -> None:
        """Swap in a new latest_snapshot when the last one is old enough, or the engine is idle
        (under the engine lock)."""
        if force or not self.engine.has_work or now - self._published_at >= PUBLISH_INTERVAL_S:
            self._latest_snapshot = self.engine.snapshot(now)
            self._published_at = now

    def _deliver(self, output: StepOutput) -> None:
        """Hand text pieces and results to their handles (under the engine lock, so that a
        cancel that returned is never followed by a piece of that request), then tell the
        delivery listeners."""
        if not output.pieces and not output.finished:
            return
        with self._wake:
            emit_to = [self._handles[piece.request_id] for piece in output.pieces]
            finish = [self._handles.pop(result.id) for result in output.finished]
        for handle, piece in zip(emit_to, output.pieces):
            handle.emit(piece)
        for handle, result in zip(finish, output.finished):
            handle.finish(result)
        self._tell_delivery_listeners()

    def _tell_delivery_listeners(self) -> None:
        for listener in self._delivery_listeners:  # a list never changed in place: no lock to read it
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the engine
                logger.exception("a delivery listener failed")


def _llama_backend(model, config: RunnerConfig, owns_model: bool) -> Backend:
    """A context on a loaded model, sized and threaded as the config says."""
    from .backend import LlamaBackend

    return LlamaBackend(model, config.parallel, config.slot_ctx, config.n_batch, config.threads, owns_model=owns_model,
                        batch_invariant=config.batch_invariant, flash_attn=config.flash_attn.value)


def model_placement(config: RunnerConfig) -> dict[str, Any]:
    """The config's model parameters for llama.cpp: where the layers go."""
    return dict(n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu, split_mode=config.split_mode.value,
                tensor_split=config.tensor_split)


def _open_llama_backend(config: RunnerConfig) -> Backend:
    from .loading import open_model

    model = open_model(config.model, config.chat_template, repack_weights=not config.batch_invariant,
                            **model_placement(config))
    try:
        return _llama_backend(model, config, owns_model=True)
    except BaseException:
        model.close()
        raise
