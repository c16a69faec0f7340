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

Runner is the front; the parts live next to it: the inbox, its lock, the requests' handles and
the worker thread in multiseq.loop.inbox; the handles' delivery, the listeners and the published
snapshot in multiseq.loop.delivery; the step itself, under the engine lock, in multiseq.loop.stepping;
the worker's loop and the engine's failure in multiseq.loop.worker_loop; a request's way in
(submit) in multiseq.loop.intake; cancels in multiseq.loop.cancelling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..llama.batch import Backend
from ..config import DEFAULT_SLOT_CTX, KV_POOL_AUTO, RANK, RunnerConfig
from .delivery import PUBLISH_INTERVAL_S, Deliveries, RequestHandle, SnapshotPublisher  # noqa: F401 - re-exported
from .cancelling import Cancelling
from .engine import Engine
from .step_output import TextPiece
from ..kv.hostcache import PrefixHolding, SharedPrefix
from .inbox import Inbox
from .intake import Intake
from ..llama.kv_sizing import default_pool
from ..request import Request, Result
from .stats import RunnerSnapshot, RunStats
from .stepping import Stepper
from .worker_loop import WorkerLoop


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
        self._inbox = Inbox()  # with the inbox lock, held for list operations only
        self._deliveries = Deliveries(self._inbox.lock, self._inbox.handles)
        self._publisher = SnapshotPublisher(self.engine)
        self._stepper = Stepper(self.engine, self._lock, self._inbox, self._deliveries, self._publisher)
        self._worker = WorkerLoop(self.engine, self._lock, self._inbox, self._stepper, self._deliveries)
        self._intake = Intake(self.engine, self._lock, self._inbox, self._deliveries, self._stepper, self._worker,
                              autostart)
        self._cancelling = Cancelling(self.engine, self._lock, self._inbox, self._stepper)
        self._closed = False

    @classmethod
    def on_model(cls, model, config: RunnerConfig, autostart: bool = True) -> Runner:
        """A runner with a new context on an already loaded multiseq.llama.backend.LlamaModel, which
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
        """The per-slot window llama.cpp allocated (it rounds up)."""
        return self.backend.allocated_window

    @property
    def device(self) -> str | None:
        """Where the model runs, as llama.cpp placed it ("CPU (...)", or GPUs and their layers);
        None when the backend does not say."""
        return self.backend.device

    @property
    def pooling(self) -> str:
        """How embedding requests pool by default: --pooling, else as the GGUF says, else mean."""
        return self.engine.maker.pooling

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
        return self._intake.submit(request, stream, on_finish, on_piece)

    @property
    def tool_family(self) -> dict[str, Any]:
        """The family the model writes tool calls and reasoning in (detected from its chat
        template, or --tool-format): its name, what it writes, its reasoning markers."""
        return self.engine.tools.described()

    @property
    def failure(self) -> str | None:
        """Why the engine stopped (None while it runs): a failure that was no one request's.
        Every request then ended with an error, and new ones end with one at once; a server
        answers /health with 503, and a supervisor should start a new one."""
        return self._worker.failure

    @property
    def failure_message(self) -> str:
        return self._worker.failure_message

    def prompt_text(self, request: Request) -> str:
        """The request's prompt as text (a chat rendered with its tools); ValueError or
        BackendError when it cannot be rendered. Any thread."""
        return self.engine.prompt_text(request)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The request's prompt as tokens (a chat rendered with its tools); ValueError or
        BackendError when it cannot be rendered. Any thread."""
        return self.engine.prompt_tokens(request)

    # --- prefixes shared between servers of the same model (replicas) ------------------------

    @property
    def can_import_prefixes(self) -> bool:
        """Whether another server's prefix KV can be kept here (host memory is on)."""
        return self.engine.host_cache.is_enabled

    def prefix_holding(self, prompt: list[int] | np.ndarray, share_more_than: int | None = None) -> PrefixHolding:
        """How much of `prompt` this runner's slots and host memory hold, and how much a prefill
        under way will hold; with share_more_than, also the KV of the longest prefix held when it
        is longer than that (for import_prefix on another runner of the same model and
        settings). Requests submitted before the call count as waiting ones. Waits for the step
        under way to end."""
        def holding() -> PrefixHolding:
            self._stepper.apply_inbox()  # requests posted since the last step are in the queue first
            return self.engine.prefix_holding(prompt, share_more_than)

        return self.between_steps(holding)

    def prefill_seconds(self, num_tokens: int) -> float:
        """What prefilling num_tokens costs here, by the running estimate the host memory's
        restores are weighed with (a float read: any thread)."""
        return num_tokens * self.engine.host_cache.costs.prefill_seconds_per_token

    def import_prefix(self, shared: SharedPrefix) -> bool:
        """Keep a prefix's KV that another runner exported in host memory: a request whose
        prompt starts with it restores it instead of prefilling. False when it is not kept
        (host memory is off or too small, or already holds it). Waits for the step under way."""
        return self.between_steps(lambda: self.engine.host_cache.import_shared(shared))

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
        return self._cancelling.cancel(request_id)

    def cancel_soon(self, request_id: str) -> bool:
        """Cancel one request as cancel() does, without waiting: the worker applies it before
        its next step (or before it applies the step running now), so a piece or two may still
        come. Safe on an event loop. Returns whether the request was known (waiting, running,
        or being tokenized)."""
        return self._cancelling.cancel_soon(request_id)

    def cancel_all(self) -> int:
        """Cancel everything at once: waiting requests are drained with a Cancelled error and
        running ones stop at the next step boundary. No request waiting at the time of the call
        is admitted afterwards; requests submitted after it returns run normally.
        Returns how many requests were cancelled."""
        return self._cancelling.cancel_all()

    def cancel_all_soon(self) -> None:
        """cancel_all() without waiting (safe on an event loop): the worker applies it before
        its next step; requests submitted after this call run normally."""
        self._cancelling.cancel_all_soon()

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet in a slot (being tokenized, posted, or queued). Never
        waits for a step."""
        return self._inbox.num_waiting

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
        return self._publisher.latest

    def add_delivery_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each batch of on_piece/on_finish calls (one per step, told as
        the next decode lets go of the GIL, or at once when none follows; one per cancel or
        rejection), on the thread that made them: a consumer that collects what its callbacks
        get can hand the whole batch over at once."""
        self._deliveries.add_listener(listener)

    def remove_delivery_listener(self, listener: Callable[[], None]) -> None:
        self._deliveries.remove_listener(listener)

    def clear_prefix_cache(self) -> None:
        """Forget the prompt prefixes kept in idle slots and clear their KV; returns once done
        (between two steps: never while a decode runs)."""
        self.between_steps(self.engine.placement.clear)

    def between_steps(self, work: Callable[[], Any]) -> Any:
        """Run `work` (which may use the engine and its backend) on the thread that steps the
        engine, between two steps, and return its value (or raise its exception). Without a
        worker thread it runs here, once no step() in another thread is running."""
        return self._worker.between_steps(work)

    def reset_stats(self) -> None:
        with self._lock:
            self.engine.stats.reset()

    def close(self) -> None:
        """Cancel whatever is left, stop the worker thread and free the model. Idempotent."""
        if self._closed:
            return
        self.cancel_all()
        worker = self._inbox.close()
        if worker is not None:
            worker.join()
        self._worker.finish_here()  # without a worker (autostart off), the work left is done here
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
        self._inbox.start_worker(self._worker.run)

    def step(self) -> bool:
        """Apply the inbox and run the queued commands, then one step of the engine, and deliver
        what it produced; False when there was nothing to decode. The worker calls this;
        without a worker, a caller may. A failure of a step that is no one request's (one
        request's faults fail that request inside the step) stops the engine: see failure."""
        return self._worker.step()


def _llama_backend(model, config: RunnerConfig, owns_model: bool) -> Backend:
    """A context on a loaded model, sized and threaded as the config says."""
    from ..llama.backend import LlamaBackend, free_memory_for_kv

    cache_types = (config.cache_type_k, config.cache_type_v)
    pool, session_ctx = config.kv_pool, config.session_ctx
    if pool == KV_POOL_AUTO:
        trained = model.n_ctx_train or DEFAULT_SLOT_CTX
        per_token = model.kv_bytes_per_token(cache_types)
        sized = default_pool(trained, config.parallel, per_token or 0, free_memory_for_kv(model) if per_token else None)
        pool = sized.tokens
        session_ctx = min(config.slot_ctx or sized.session_tokens, pool)
    return LlamaBackend(model, config.parallel, session_ctx, config.n_batch, config.threads, owns_model=owns_model,
                        batch_invariant=config.batch_invariant, flash_attn=config.flash_attn.value,
                        cache_types=cache_types, pool_tokens=pool,
                        windows_while_they_fit=pool is not None and config.kv_layout == "auto" and config.parallel > 1,
                        ranks=(config.pooling or model.pooling) == RANK)


def model_placement(config: RunnerConfig) -> dict[str, Any]:
    """The config's model parameters for llama.cpp: where the layers go."""
    return dict(n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu, split_mode=config.split_mode.value,
                tensor_split=config.tensor_split)


def _open_llama_backend(config: RunnerConfig) -> Backend:
    from ..loading import open_model

    model = open_model(config.model, config.chat_template, repack_weights=not config.batch_invariant,
                            **model_placement(config))
    try:
        projector = config.mmproj or (model.found_projector if config.auto_mmproj else None)
        if projector:
            model.load_projector(projector, config.threads, "off" if config.batch_invariant else config.flash_attn.value)
        return _llama_backend(model, config, owns_model=True)
    except BaseException:
        model.close()
        raise
