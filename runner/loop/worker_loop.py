"""What a Runner's worker thread runs: steps of the engine while there is work, the commands
other threads wait for between two steps, and, when a step fails in a way that is no one
request's, the engine's stop (every request ended with the reason, new ones refused with it).
See multiseq.loop.runner for the locking rules.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .delivery import Deliveries
from .engine import Engine
from ..errors import EngineFailure, first_line
from .inbox import Command, Inbox
from .stepping import Stepper

logger = logging.getLogger("multiseq.runner")

_IDLE_STEP_SECONDS = 0.001


class WorkerLoop:
    """The runner's step loop, its commands between steps, and the engine's failure (Runner.failure)."""

    def __init__(self, engine: Engine, lock: threading.RLock, inbox: Inbox, stepper: Stepper,
                 deliveries: Deliveries) -> None:
        self._engine = engine
        self._lock = lock  # the engine lock
        self._inbox = inbox
        self._stepper = stepper
        self._deliveries = deliveries
        self.failure: str | None = None  # why the engine stopped, once it has

    @property
    def failure_message(self) -> str:
        return f"the engine stopped: {self.failure}"

    def run(self) -> None:
        """The worker thread: a step whenever there is work, until the inbox closes or the engine stops."""
        while self._inbox.wait_for_work():
            if not self.step():
                time.sleep(_IDLE_STEP_SECONDS)  # work exists but none could be planned yet
            if self.failure is not None:
                return

    def step(self) -> bool:
        """One step (see Runner.step); False when there was nothing to decode or the engine stopped."""
        if self.failure is not None:
            return False
        try:
            return self._stepper.step()
        except Exception as error:  # noqa: BLE001 - said to every request and to /health, never lost
            self._stop(error)
            return False

    def between_steps(self, work: Callable[[], Any]) -> Any:
        """Run `work` on the thread that steps the engine, between two steps (see
        Runner.between_steps), and return its value (or raise its exception)."""
        command = Command(work)
        if self._inbox.is_worker_thread():  # it would wait for itself
            raise RuntimeError("the runner's own thread (an on_finish callback) cannot wait for a step to end")
        has_worker = self._inbox.post_command(command)
        if not has_worker:
            self._stepper.run_commands()
        return command.outcome()

    def finish_here(self) -> None:
        """Step on this thread until no work is left (a runner without a worker, closing),
        unless the engine stopped."""
        while self.failure is None and self._has_work():
            self.step()

    def _has_work(self) -> bool:
        with self._lock:
            return self._engine.has_work or self._inbox.has_posted()

    def _stop(self, error: Exception) -> None:
        """The step loop cannot go on: every request ends with the reason, new ones are refused
        with it, and the commands waiting for a step are told."""
        reason = (first_line(error) if isinstance(error, EngineFailure)  # a bug's own words stay in the log
                  else f"internal error ({type(error).__name__}; the log has its traceback)")
        logger.error("the engine stopped: %s", reason, exc_info=error)
        self.failure = reason
        self._inbox.stop(RuntimeError(self.failure_message))
        try:
            self._stepper.fail_all(self.failure_message)
        except Exception:  # noqa: BLE001 - the handles are ended below whatever the engine's state
            logger.exception("failing the requests in the engine failed")
        self._deliveries.fail_remaining(self._inbox.take_handles(), self.failure_message)
