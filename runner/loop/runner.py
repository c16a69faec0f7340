"""Runner: the engine behind a front that any thread may use.

The engine has one owner, a worker thread (multiseq.loop.worker); the runner's methods post
messages to it. submit() prepares a request (tokenizes it, renders its chat, compiles its
constraint) on the calling thread, which reads only the model and the config, and posts it;
cancel_soon() and cancel_all_soon() post and return (an event loop calls them); cancel(),
cancel_all(), stats(), snapshot() and between_steps() wait for the owner's reply. What readers
that must never wait want (the queue's length, the slots, the totals) the owner publishes:
num_waiting and latest_snapshot. The pieces, results and listeners: multiseq.loop.delivery.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..llama.batch import Backend
from ..config import RunnerConfig
from .delivery import PUBLISH_INTERVAL_S, Deliveries, RequestHandle, SnapshotPublisher  # noqa: F401 - re-exported
from .engine import Engine
from .step_output import TextPiece
from ..kv.hostcache import PrefixHolding, SharedPrefix
from ..request import Request, Result
from .stats import RunnerSnapshot, RunStats
from .worker import Arrive, Cancel, CancelAll, Enqueue, Inbox, Refused, Worker


class Runner:
    """Continuous batching over one llama.cpp context with `config.parallel` slots, driven by
    a worker thread; usable from any thread."""

    def __init__(self, config: RunnerConfig | None = None, backend: Backend | None = None,
                 autostart: bool = True) -> None:
        self.config = config or RunnerConfig()
        if backend is None:
            from ..loading import open_backend  # llama.cpp, loaded only when a real model runs
            backend = open_backend(self.config)
        self.engine = Engine(self.config, backend)  # the worker's; tests and benches read it between steps
        self.backend: Backend = self.engine.backend
        # What the model and config fix, read here once: the engine is its owner's alone.
        self._maker = self.engine.maker
        self.window: int = self.engine.window  # per slot, prompt plus generation, as enforced
        self.pooling: str = self._maker.pooling  # how embedding requests pool by default
        self.tool_family: dict[str, Any] = self.engine.tools.described()  # how its calls and reasoning read
        self.can_import_prefixes: bool = self.engine.host_cache.is_enabled  # host memory is on
        self._costs = self.engine.host_cache.costs
        self._inbox = Inbox()
        self._deliveries = Deliveries()
        self._publisher = SnapshotPublisher(self.engine)
        self._worker = Worker(self.engine, self._inbox, self._deliveries, self._publisher)
        self._request_numbers = itertools.count()
        self._closed = False
        if autostart:
            self.start()

    @classmethod
    def on_model(cls, model, config: RunnerConfig, autostart: bool = True) -> Runner:
        """A runner with a new context on an already loaded multiseq.llama.backend.LlamaModel, which
        it does not free on close: many runners (say, at different parallelism) can share one
        loaded model. The model stays where it was loaded: the config's n_gpu_layers, main_gpu,
        split_mode and tensor_split are the model's business, not the context's."""
        from ..loading import backend_on

        return cls(config, backend=backend_on(model, config, owns_model=False), autostart=autostart)

    @property
    def allocated_window(self) -> int:
        """The per-slot window llama.cpp allocated (it rounds up)."""
        return self.backend.allocated_window

    @property
    def device(self) -> str | None:
        """Where the model runs, as llama.cpp placed it; None when the backend does not say."""
        return self.backend.device

    # --- requests ------------------------------------------------------------------------------

    def submit(self, request: Request, stream: bool = False, on_finish: Callable[[Result], None] | None = None,
               on_piece: Callable[[TextPiece], None] | None = None) -> RequestHandle:
        """Queue a request from any thread and return its handle at once.

        stream=True makes the handle iterable over text pieces as they are produced.
        on_piece is called with each TextPiece (text, and its tokens' logprobs when asked) and
        on_finish with the Result when the request ends, both on the runner's thread and in
        order: keep them short (put what they get in a queue, or hand it to an event loop with
        loop.call_soon_threadsafe, or collect them and hand them over from a delivery listener).
        A request that cannot run (a bad prompt, a prompt that cannot fit, a duplicate id) gets
        its error result on its handle; nothing else is disturbed. Preparing runs on the calling
        thread and never waits for a step."""
        return self._submit_all([request], stream, on_finish, on_piece)[0]

    def _submit_all(self, requests: Iterable[Request], stream: bool = False,
                    on_finish: Callable[[Result], None] | None = None,
                    on_piece: Callable[[TextPiece], None] | None = None) -> list[RequestHandle]:
        """Submit requests that join the queue together, in order, once all are prepared."""
        requests = list(requests)
        handles = [RequestHandle(request.id or f"req-{next(self._request_numbers)}", stream, on_finish, on_piece)
                   for request in requests]
        if not self._inbox.post(*[Arrive(handle) for handle in handles]):
            self._deliveries.fail(handles, self._worker.failure_message)
            return handles
        # The owner knows them now: a cancel or a close that comes while they are prepared
        # reaches them, and ends them as their sequences come.
        prepared: list[Enqueue | Refused] = []
        try:
            for request, handle in zip(requests, handles):
                prepared.append(self._prepare(request, handle, stream or on_piece is not None))
        finally:  # an interrupt: the ones not prepared are forgotten
            self._inbox.post(*prepared, *[Refused(handle) for handle in handles[len(prepared):]])
        return handles

    def _prepare(self, request: Request, handle: RequestHandle, streams: bool) -> Enqueue | Refused:
        try:
            seq = self._maker.new_sequence(request, handle.id, streams=streams)
        except Exception as error:  # noqa: BLE001 - any failure here belongs to this request alone
            self._deliveries.reject(handle, error)
            return Refused(handle)
        return Enqueue(handle, seq)

    def run_batch(self, requests: Iterable[Request]) -> list[Result]:
        """Run requests to completion and return their results in input order.

        Failed and cancelled requests are results too: check result.ok / result.error. A
        request cancelled before it started has finish_reason "cancelled" and an error, never
        an empty successful answer."""
        handles = self._submit_all(requests)
        try:
            return [handle.result() for handle in handles]
        except BaseException:
            for handle in handles:
                self.cancel_soon(handle.id)
            raise

    def prompt_text(self, request: Request) -> str:
        """The request's prompt as text (a chat rendered with its tools); ValueError or
        BackendError when it cannot be rendered. Any thread."""
        return self._maker.prompt_text(request)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The request's prompt as tokens; ValueError or BackendError when it cannot be rendered. Any thread."""
        return self._maker.prompt_tokens(request)

    # --- cancels ---------------------------------------------------------------------------------

    def cancel(self, request_id: str) -> bool:
        """Cancel one request. A waiting one ends with a Cancelled error and never runs; a
        running one stops at the next step boundary, keeping its text, with finish_reason
        "cancelled". Nothing more is emitted for it once this returns, which may mean waiting
        for the step under way (an event loop calls cancel_soon instead). Returns False (and
        logs) when the id is unknown or already finished."""
        return self._worker.call(lambda: self._worker.cancel(request_id), runs_after_stop=True)

    def cancel_soon(self, request_id: str) -> None:
        """Cancel one request as cancel() does, without waiting: the worker applies it before
        its next step (or before it applies the step running now), so a piece or two may still
        come. Safe on an event loop."""
        self._inbox.post(Cancel(request_id))

    def cancel_all(self) -> int:
        """Cancel everything at once: waiting requests are drained with a Cancelled error and
        running ones stop at the next step boundary. No request known at the time of the call
        is admitted afterwards; requests submitted after it returns run normally. Returns how
        many requests were cancelled."""
        return self._worker.call(self._worker.cancel_all, runs_after_stop=True)

    def cancel_all_soon(self) -> None:
        """cancel_all() without waiting (safe on an event loop)."""
        self._inbox.post(CancelAll())

    # --- what readers see ----------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """Why the engine stopped (None while it runs): a failure that was no one request's.
        Every request then ended with an error, and new ones end with one at once; a server
        answers /health with 503, and a supervisor should start a new one."""
        return self._worker.failure

    @property
    def failure_message(self) -> str:
        return self._worker.failure_message

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet in a slot (being prepared, posted, or queued). Never waits."""
        return self._inbox.num_waiting

    @property
    def latest_snapshot(self) -> RunnerSnapshot:
        """The snapshot the worker published last: at most PUBLISH_INTERVAL_S (plus a step)
        old while requests run, exact once the engine is idle. Never waits: for an event loop."""
        return self._publisher.latest

    def stats(self) -> RunStats:
        """The totals at this moment (waits for the step under way)."""
        return self._worker.call(self.engine.stats.snapshot, runs_after_stop=True)

    def snapshot(self) -> RunnerSnapshot:
        """Every slot and counter at this moment, as plain values (waits for the step under way)."""
        return self._worker.call(lambda: self.engine.snapshot(time.perf_counter()), runs_after_stop=True)

    def reset_stats(self) -> None:
        self.between_steps(self.engine.stats.reset)

    def add_delivery_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each batch of on_piece/on_finish calls (one per step, told as
        the next decode lets go of the GIL, or at once when none follows; one per cancel or
        rejection), on the thread that made them: a consumer that collects what its callbacks
        get can hand the whole batch over at once."""
        self._deliveries.add_listener(listener)

    def remove_delivery_listener(self, listener: Callable[[], None]) -> None:
        self._deliveries.remove_listener(listener)

    # --- work between two steps ------------------------------------------------------------------

    def between_steps(self, work: Callable[[], Any]) -> Any:
        """Run `work` (which may use the engine and its backend) on the engine's owner, between
        two steps, and return its value (or raise its exception)."""
        return self._worker.call(work)

    def clear_prefix_cache(self) -> None:
        """Forget the prompt prefixes kept in idle slots and clear their KV; returns once done."""
        self.between_steps(self.engine.placement.clear)

    def prefix_holding(self, prompt: list[int] | np.ndarray, share_more_than: int | None = None) -> PrefixHolding:
        """How much of `prompt` this runner's slots and host memory hold, and how much a prefill
        under way will hold; with share_more_than, also the KV of the longest prefix held when it
        is longer than that (for import_prefix on another runner of the same model and
        settings). Requests submitted before the call count as waiting ones."""
        return self.between_steps(lambda: self.engine.prefix_holding(prompt, share_more_than))

    def prefill_seconds(self, num_tokens: int) -> float:
        """What prefilling num_tokens costs here, by the running estimate the host memory's
        restores are weighed with (a float read: any thread)."""
        return num_tokens * self._costs.prefill_seconds_per_token

    def import_prefix(self, shared: SharedPrefix) -> bool:
        """Keep a prefix's KV that another runner exported in host memory: a request whose
        prompt starts with it restores it instead of prefilling. False when it is not kept
        (host memory is off or too small, or already holds it)."""
        return self.between_steps(lambda: self.engine.host_cache.import_shared(shared))

    # --- the worker --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (a runner made with autostart=False is stepped by its caller
        until then)."""
        self._worker.start()

    def step(self) -> bool:
        """One turn of the engine's owner on this thread (a runner without a worker thread):
        the inbox applied, one step, its output delivered; False when there was nothing to
        decode. A failure that is no one request's stops the engine: see failure."""
        return self._worker.step()

    def close(self) -> None:
        """Cancel whatever is left, stop the worker thread and free the model. Idempotent."""
        if self._closed:
            return
        self.cancel_all()
        self._inbox.close()
        if self._worker.thread is not None:
            self._worker.thread.join()
        else:
            self._worker.finish_here()
        self.backend.close()
        self._closed = True

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
