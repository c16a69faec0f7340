"""A request's way into a Runner from any thread: its handle at once, its sequence prepared
(tokenized, its chat rendered, its constraint compiled) on the calling thread, then posted to
the inbox; a request that cannot run ends with its error at once. See multiseq.loop.runner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .delivery import Deliveries, RequestHandle
from .engine import Engine
from .step_output import TextPiece
from .inbox import Inbox
from ..request import Request, Result
from .stepping import Stepper
from .worker_loop import WorkerLoop


class Intake:
    """Runner.submit's work."""

    def __init__(self, engine: Engine, lock: threading.RLock, inbox: Inbox, deliveries: Deliveries,
                 stepper: Stepper, worker: WorkerLoop, autostart: bool) -> None:
        self._engine = engine
        self._lock = lock  # the engine lock
        self._inbox = inbox
        self._deliveries = deliveries
        self._stepper = stepper
        self._worker = worker
        self._autostart = autostart

    def submit(self, request: Request, stream: bool, on_finish: Callable[[Result], None] | None,
               on_piece: Callable[[TextPiece], None] | None) -> RequestHandle:
        """Queue a request and return its handle at once (see Runner.submit)."""
        admission = self._inbox.admit(
            request.id, lambda request_id: RequestHandle(request_id, stream, on_finish, on_piece))
        handle = admission.handle
        if admission.is_duplicate:
            self._reject(handle, f"request id {handle.id!r} is already waiting or running")
            return handle
        if self._worker.failure is not None:  # nothing steps the engine any more
            self._inbox.forget(handle.id)
            self._deliveries.fail_remaining([handle], self._worker.failure_message)
            return handle
        # Tokenizing, rendering a chat and compiling a constraint read only the model and the
        # config, and take a while: steps and other requests go on meanwhile. A cancel, a
        # cancel_all or a close that comes now is noted, and applied once the request is queued.
        try:
            seq = self._engine.new_sequence(request, handle.id)
        except Exception as error:  # noqa: BLE001 - any failure here belongs to this request alone
            self._inbox.forget(handle.id)
            self._reject(handle, error)
            return handle
        seq.streams = stream or on_piece is not None
        has_worker = self._inbox.post_request(seq)
        if not has_worker:  # no worker drains the inbox: queue it now (a step() may be running)
            with self._lock:
                self._stepper.apply_inbox()
        if self._autostart:
            self._inbox.start_worker(self._worker.run)
        if self._worker.failure is not None:  # the engine stopped while the request was posted
            self._deliveries.fail_remaining(self._inbox.take_handles(), self._worker.failure_message)
        return handle

    def _reject(self, handle: RequestHandle, error: str | Exception) -> None:
        """End a request that could not even be queued. What the request asked for
        (ValueError) or what the model cannot do with it (BackendError) is the caller's error,
        said as is; anything else is a bug, logged, and said as one."""
        with self._lock:  # the engine's counters belong to whoever holds its lock
            self._engine.record_rejection()
        self._deliveries.reject(handle, error)
