"""The engine-lock side of the runner: one step of the engine, the commands run between two
steps, and the inbox applied to the engine, each followed by the delivery of what it produced
and a new published snapshot. See multiseq.loop.runner for the locking rules: the engine lock is held
while a step is scheduled and while its output is applied, never while llama.cpp decodes.
"""

from __future__ import annotations

import threading
import time

from .delivery import Deliveries, SnapshotPublisher
from .engine import Engine
from .inbox import Inbox


class Stepper:
    """Steps the engine and runs the posted commands, under the runner's engine lock."""

    def __init__(self, engine: Engine, lock: threading.RLock, inbox: Inbox, deliveries: Deliveries,
                 publisher: SnapshotPublisher) -> None:
        self.engine = engine
        self.lock = lock  # the engine lock
        self.step_lock = threading.Lock()  # held by whoever runs a step (the worker, or a step() caller)
        self._inbox = inbox
        self._deliveries = deliveries
        self._publisher = publisher

    def step(self) -> bool:
        """Apply the inbox and run the queued commands, then one step of the engine, and deliver
        what it produced; False when there was nothing to decode."""
        with self.step_lock:
            self._run_commands()
            with self.lock:
                self.apply_inbox()
                plan = self.engine.schedule()
                self._inbox.note_engine_state(self.engine)
                self._deliver()
                if not plan:
                    self._deliveries.tell_owed()
                    self._publisher.publish(time.perf_counter())
                    return False
            # The listeners of the last step's output are told as llama.cpp is about to decode
            # without the GIL: the thread they wake (a server's event loop) takes the GIL while
            # this one waits in llama_decode, not while it plans.
            self._deliveries.tell_owed()
            executed = self.engine.execute(plan)  # llama_decode and sampling, without the lock
            with self.lock:
                self.apply_inbox()  # cancels that came during the decode drop its tokens
                self.engine.update(executed)
                self._inbox.note_engine_state(self.engine)
                self._publisher.publish(time.perf_counter())  # before the results: readers see them counted
                # With more to decode, the next step tells the listeners just before its decode.
                self._deliver(tell_now=not self.engine.has_work)
            return True

    def run_commands(self) -> None:
        """Run the queued commands here, once no step in another thread is running."""
        with self.step_lock:
            self._run_commands()

    def _run_commands(self) -> None:
        """Run the queued commands (on the stepping thread, holding the step lock)."""
        with self.lock:
            for command in self._inbox.take_commands():
                command.run()
            self._deliver()

    def apply_inbox(self) -> None:
        """Apply what was posted, in order (under the engine lock), and deliver what that ended."""
        if self._inbox.apply_to(self.engine):
            self._deliver()

    def _deliver(self, tell_now: bool = True) -> None:
        """Deliver what the engine produced (under the engine lock); a request whose callback
        raised fails in the engine, alone, and its result follows when it is retired. The
        delivery listeners are told now, or (tell_now False) owed until tell_owed()."""
        faults = self._deliveries.deliver(self.engine.take_output(), tell_now)
        for request_id, message in faults.items():
            self.engine.fail_request(request_id, message)

    def settle(self, force_publish: bool = False) -> None:
        """After a change outside a step (a cancel, a failure; under the engine lock): the inbox
        learns the engine's state, what ended is delivered, and a snapshot published."""
        self._inbox.note_engine_state(self.engine)
        self._deliver()
        self._publisher.publish(time.perf_counter(), force=force_publish)

    def fail_all(self, reason: str) -> None:
        """End every request with an internal error (a step failed: a bug)."""
        with self.lock:
            self.engine.fail_all(reason)
            self.settle(force_publish=True)
