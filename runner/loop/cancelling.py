"""Cancelling a Runner's requests: blocking (under the engine lock, so that nothing more is
emitted once the call returns) or soon (posted to the inbox, for an event loop). See
multiseq.loop.runner.
"""

from __future__ import annotations

import logging
import threading

from .engine import Engine
from .inbox import Inbox
from .stepping import Stepper

logger = logging.getLogger("multiseq.runner")


class Cancelling:
    """Runner.cancel, cancel_soon, cancel_all and cancel_all_soon's work."""

    def __init__(self, engine: Engine, lock: threading.RLock, inbox: Inbox, stepper: Stepper) -> None:
        self._engine = engine
        self._lock = lock  # the engine lock
        self._inbox = inbox
        self._stepper = stepper

    def cancel(self, request_id: str) -> bool:
        """Cancel one request, waiting for the step being scheduled (see Runner.cancel)."""
        if self._inbox.cancel_if_tokenizing(request_id):
            return True
        with self._lock:
            self._stepper.apply_inbox()  # a request posted but not yet queued is in the engine first
            found = self._engine.abort(request_id)
            self._stepper.settle()
        if not found:
            logger.info("cancel(%r): no such waiting or running request", request_id)
        return found

    def cancel_soon(self, request_id: str) -> bool:
        """Post a cancel for the worker to apply before its next step (see Runner.cancel_soon)."""
        return self._inbox.post_cancel(request_id)

    def cancel_all(self) -> int:
        """Cancel everything now (see Runner.cancel_all); how many requests were cancelled."""
        with self._lock:
            num_tokenizing = self._inbox.cancel_tokenizing()
            self._stepper.apply_inbox()
            count = self._engine.abort_all() + num_tokenizing
            self._stepper.settle()
            return count

    def cancel_all_soon(self) -> None:
        """Post a cancel_all for the worker to apply before its next step."""
        self._inbox.post_cancel_all()
