"""Runner: the engine behind a front that any thread may use (docs/python-api.md says what each
call promises). The engine's owner is a worker thread (multiseq.loop.worker): submit() prepares
a request on the calling thread (tokens, chat, constraint: it reads only the model and config)
and posts it; the *_soon cancels post and return (an event loop's); the other calls wait for
the owner's reply. num_waiting and latest_snapshot are what the owner publishes: they never wait.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..llama.batch import Backend
from ..config import RunnerConfig
from .delivery import Deliveries, RequestHandle
from .engine import Engine
from .step_output import TextPiece
from ..kv.hostcache import PrefixHolding, SharedPrefix
from ..request import Request, Result
from .stats import RunnerSnapshot, RunStats
from .worker import Arrive, Cancel, Inbox, Prepared, Worker


class Runner:
    """Continuous batching over one llama.cpp context with `config.parallel` slots, driven by
    a worker thread; usable from any thread."""

    def __init__(self, config: RunnerConfig | None = None, backend: Backend | None = None,
                 autostart: bool = True) -> None:
        self.config = config or RunnerConfig()
        if backend is None:
            from ..loading import open_backend  # llama.cpp, loaded only when a real model runs
            backend = open_backend(self.config)
        self.engine = Engine(self.config, backend)  # its owner's; tests and benches read it between steps
        self.backend: Backend = self.engine.backend
        # What the model and config fix, read here once: the engine is its owner's alone.
        self._maker = self.engine.maker
        self.window: int = self.engine.window  # per slot, prompt plus generation, as enforced
        self.allocated_window: int = backend.allocated_window  # as llama.cpp allocated it (it rounds up)
        self.device: str | None = backend.device  # where llama.cpp placed the model (None: not said)
        self.pooling: str = self._maker.pooling  # how embedding requests pool by default
        self.tool_family: dict[str, Any] = self.engine.tools.described()  # how its calls and reasoning read
        self.can_import_prefixes: bool = self.engine.host_cache.is_enabled  # host memory is on
        self._costs = self.engine.host_cache.costs
        self._inbox, self._deliveries = Inbox(), Deliveries()
        self._worker = Worker(self.engine, self._inbox, self._deliveries)
        self._request_numbers = itertools.count()
        self._closed = False
        if autostart:
            self.start()

    @classmethod
    def on_model(cls, model, config: RunnerConfig, autostart: bool = True) -> Runner:
        """A runner with a new context on a loaded LlamaModel, which it does not free on close
        (several runners may share one model; the model stays where it was loaded)."""
        from ..loading import backend_on

        return cls(config, backend=backend_on(model, config, owns_model=False), autostart=autostart)

    # --- requests ------------------------------------------------------------------------------

    def submit(self, request: Request, stream: bool = False, on_finish: Callable[[Result], None] | None = None,
               on_piece: Callable[[TextPiece], None] | None = None) -> RequestHandle:
        """Queue a request from any thread; its handle at once. stream=True: the handle iterates
        over text pieces. on_piece and on_finish run on the runner's thread, in order: keep them
        short. A request that cannot run ends with its error on its handle."""
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
        # The owner knows them now: a cancel or a close that comes while they are prepared reaches them.
        prepared: list[Prepared] = []
        try:
            for request, handle in zip(requests, handles):
                prepared.append(self._prepare(request, handle, stream or on_piece is not None))
        finally:  # an interrupt: the ones not prepared are forgotten
            self._inbox.post(*prepared, *[Prepared(handle, None) for handle in handles[len(prepared):]])
        return handles

    def _prepare(self, request: Request, handle: RequestHandle, streams: bool) -> Prepared:
        try:
            return Prepared(handle, self._maker.new_sequence(request, handle.id, streams=streams))
        except Exception as error:  # noqa: BLE001 - any failure here belongs to this request alone
            self._deliveries.reject(handle, error)
            return Prepared(handle, None)

    def run_batch(self, requests: Iterable[Request]) -> list[Result]:
        """Run requests to completion; their results in input order (failed and cancelled ones too)."""
        handles = self._submit_all(requests)
        try:
            return [handle.result() for handle in handles]
        except BaseException:
            for handle in handles:
                self.cancel_soon(handle.id)
            raise

    def prompt_text(self, request: Request) -> str:
        """The request's prompt as text (a chat rendered with its tools); any thread."""
        return self._maker.prompt_text(request)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The request's prompt as tokens; any thread."""
        return self._maker.prompt_tokens(request)

    def cancel(self, request_id: str) -> bool:
        """Cancel one request; nothing more comes for it once this returns. False when unknown."""
        return self._worker.call(lambda: self._worker.cancel(request_id), runs_after_stop=True)

    def cancel_soon(self, request_id: str) -> None:
        """cancel() without waiting (an event loop's): a piece or two may still come."""
        self._inbox.post(Cancel(request_id))

    def cancel_all(self) -> int:
        """Cancel every request known now (none of them is admitted afterwards); how many."""
        return self._worker.call(self._worker.cancel_all, runs_after_stop=True)

    def cancel_all_soon(self) -> None:
        """cancel_all() without waiting (an event loop's)."""
        self._inbox.post(Cancel(None))

    # --- what readers see ----------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """Why the engine stopped (None while it runs): every request then ended with an error,
        and new ones end with one at once."""
        return self._worker.failure

    @property
    def failure_message(self) -> str:
        return self._worker.failure_message

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet in a slot (being prepared, posted, or queued)."""
        return self._inbox.num_waiting

    @property
    def latest_snapshot(self) -> RunnerSnapshot:
        """The last snapshot published (at most PUBLISH_INTERVAL_S old while requests run)."""
        return self._worker.latest_snapshot

    def stats(self) -> RunStats:
        """The totals at this moment (waits for the step under way)."""
        return self._worker.call(self.engine.stats.snapshot, runs_after_stop=True)

    def snapshot(self) -> RunnerSnapshot:
        """Every slot and counter at this moment (waits for the step under way)."""
        return self._worker.call(lambda: self.engine.snapshot(time.perf_counter()), runs_after_stop=True)

    def reset_stats(self) -> None:
        self.between_steps(self.engine.stats.reset)

    def add_delivery_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each batch of on_piece/on_finish calls, on the thread that made them."""
        self._deliveries.add_listener(listener)

    def remove_delivery_listener(self, listener: Callable[[], None]) -> None:
        self._deliveries.remove_listener(listener)

    # --- work between two steps ------------------------------------------------------------------

    def between_steps(self, work: Callable[[], Any]) -> Any:
        """Run `work` (which may use the engine) on its owner between two steps; its value."""
        return self._worker.call(work)

    def clear_prefix_cache(self) -> None:
        """Forget the prompt prefixes kept in idle slots and clear their KV."""
        self.between_steps(self.engine.placement.clear)

    def prefix_holding(self, prompt: list[int] | np.ndarray, share_more_than: int | None = None) -> PrefixHolding:
        """How much of `prompt` the slots and host memory hold (and will, once prefills under
        way end); with share_more_than, the KV of a longer prefix, for import_prefix elsewhere."""
        return self.between_steps(lambda: self.engine.prefix_holding(prompt, share_more_than))

    def prefill_seconds(self, num_tokens: int) -> float:
        """What prefilling num_tokens costs here, by the running estimate (any thread)."""
        return num_tokens * self._costs.prefill_seconds_per_token

    def import_prefix(self, shared: SharedPrefix) -> bool:
        """Keep another runner's exported prefix KV in host memory; False when it is not kept."""
        return self.between_steps(lambda: self.engine.host_cache.import_shared(shared))

    # --- the worker --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (autostart=False: what is submitted until then waits, and the
        first call that waits for the worker starts it)."""
        self._worker.start()

    def close(self) -> None:
        """Cancel whatever is left, write the kept prefixes to the disk tier (--cache-disk),
        stop the worker thread and free the model. Idempotent."""
        if self._closed:
            return
        self.cancel_all()
        if self.failure is None:  # what the slots and host memory keep, to the disk tier (where on)
            self.between_steps(self.engine.placement.persist)
        self._inbox.close()
        self._worker.thread.join()
        self.backend.close()
        self._closed = True

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
