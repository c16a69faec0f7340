"""The engine's owner: one thread steps the engine, and nothing else touches it.

Other threads post messages to its inbox: a request's arrival (before it is prepared, so that
a cancel finds it), its prepared sequence, cancels, and calls (work run between two steps, whose
value a future carries back). One turn: apply the messages, plan, decode (llama.cpp lets go of
the GIL), apply the cancels that came meanwhile (they drop their requests' tokens), apply the
step's output, deliver it, publish a snapshot. A reply is sent once what its message ended was
delivered: nothing more comes for a request whose cancel() returned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

from .delivery import Deliveries, RequestHandle
from .engine import Engine
from ..errors import EngineFailure, first_line
from .sequence import Sequence
from .stats import RunnerSnapshot

logger = logging.getLogger("multiseq.runner")

_IDLE_STEP_SECONDS = 0.001
# latest_snapshot is at most this old while requests run (and exact once the engine is idle). Its
# readers (the dashboard, 4 times a second; /metrics; the batch worker's queue count) need no more.
PUBLISH_INTERVAL_S = 0.1


class EngineStopped(RuntimeError):
    """The engine stopped: work for it is refused, and the calls waiting are told."""


class Arrive(NamedTuple):  # a new request, known from now on; its Prepared follows
    handle: RequestHandle


class Prepared(NamedTuple):  # an arrived request's sequence (None: it could not be made)
    handle: RequestHandle
    seq: Sequence | None


class Cancel(NamedTuple):  # one request, or (None) every request known now
    request_id: str | None


class Call(NamedTuple):  # work between two steps; its reply: its value or its exception
    work: Callable[[], Any]
    reply: Future


Message = Arrive | Prepared | Cancel | Call


class Inbox:
    """What other threads post for the owner, and the count of waiting requests they read."""

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())  # wakes the idle owner
        self._messages: deque[Message] = deque()
        self._num_posted = 0  # arrivals posted that the owner has not yet applied
        self._num_taken = 0  # of them, those it took and is applying
        self._num_known = 0  # the waiting requests it knows of (being prepared, or queued), as it last said
        self._is_closed = False  # no new request or call (cancels still come)
        self._is_stopped = False  # the engine stopped: nothing is taken any more

    def post(self, *messages: Message) -> bool:
        """Post messages in order; False when the engine stopped."""
        with self._lock:
            if self._is_stopped:
                return False
            if self._is_closed and any(isinstance(message, (Arrive, Call)) for message in messages):
                raise RuntimeError("the runner is closed")
            self._num_posted += sum(isinstance(message, Arrive) for message in messages)
            self._messages.extend(messages)
            self._lock.notify()
            return True

    def take(self, stop: bool = False) -> list[Message]:
        """What was posted; stop: the engine stopped for good, later posts are refused."""
        with self._lock:
            self._is_stopped |= stop
            messages, self._messages = list(self._messages), deque()
            self._num_taken += sum(isinstance(message, Arrive) for message in messages)
            return messages

    def note_waiting(self, num_known: int) -> None:
        """The owner applied what it took, and knows of num_known waiting requests."""
        with self._lock:
            self._num_posted -= self._num_taken
            self._num_taken, self._num_known = 0, num_known

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return self._num_posted + self._num_known

    def wait(self, has_work: bool, expects_messages: bool) -> bool:
        """The idle owner waits for a message; False once closed with nothing left to do, nor
        a message it expects (a request being prepared: its sequence comes)."""
        with self._lock:
            while not (has_work or self._messages or (self._is_closed and not expects_messages)):
                self._lock.wait()
            return has_work or bool(self._messages) or not self._is_closed

    def close(self) -> None:
        with self._lock:
            self._is_closed = True
            self._lock.notify()


class Worker:
    """The engine's owner: its turns, the messages it applies, and its failure."""

    def __init__(self, engine: Engine, inbox: Inbox, deliveries: Deliveries) -> None:
        self.engine, self.inbox, self.deliveries = engine, inbox, deliveries
        self.latest_snapshot: RunnerSnapshot = engine.snapshot(time.perf_counter())  # for readers that never wait
        self._published_at = time.perf_counter()
        self.failure: str | None = None  # why the engine stopped, once it has
        self.thread = threading.Thread(target=self._run, name="multiseq-runner", daemon=True)
        self._starting = threading.Lock()  # two callers' first calls may start it at once
        self._preparing: dict[str, bool] = {}  # arrived, not yet prepared: whether a cancel reached it
        self._calls: list[Call] = []  # taken in the middle of a step: run at the next turn
        self._replies: list[tuple[Future, Any, BaseException | None]] = []  # sent once delivered

    @property
    def failure_message(self) -> str:
        return f"the engine stopped: {self.failure}"

    def start(self) -> None:
        with self._starting:
            if self.thread.ident is None:  # never started
                self.thread.start()

    def _run(self) -> None:
        while self.failure is None and self.inbox.wait(self.engine.has_work or bool(self._calls),
                                                       expects_messages=bool(self._preparing)):
            try:
                if not self._turn():
                    time.sleep(_IDLE_STEP_SECONDS)  # work exists but none could be planned yet
            except Exception as error:  # noqa: BLE001 - said to every request and to /health, never lost
                self._stop(error)

    def _turn(self) -> bool:
        self._apply_inbox()
        plan = self.engine.schedule()
        self._note_waiting()
        # The listeners hear of the last step's output (and of this one's retirements) as
        # llama.cpp is about to decode without the GIL: the thread they wake (a server's event
        # loop) takes the GIL while this one waits in llama_decode, not while it plans.
        self._deliver()
        if not plan:
            self._publish()
            return False
        executed = self.engine.execute(plan)
        self._apply_inbox(mid_step=True)  # a cancel that came during the decode drops its tokens
        self.engine.update(executed)
        self._note_waiting()
        self._publish()  # before the results: readers see them counted
        self._deliver(tell=not self.engine.has_work)  # else the next turn tells, before its decode
        return True

    def call(self, work: Callable[[], Any], runs_after_stop: bool = False) -> Any:
        """Run work on the owner between two steps; its value, or its exception raised. Once
        the engine stopped, the work is refused, or (runs_after_stop: a read, a cancel) runs
        here: nothing steps the engine any more. A worker not yet started starts."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("the runner's own thread (an on_finish callback) cannot wait for a step to end")
        reply: Future = Future()
        try:
            if not self.inbox.post(Call(work, reply)):
                raise EngineStopped(self.failure_message)
            self.start()
            return reply.result()
        except EngineStopped:  # before the call was posted, or while it waited
            if not runs_after_stop:
                raise
            self.thread.join()  # it ends right after the stop
            return work()

    # --- messages ----------------------------------------------------------------------------

    def _apply_inbox(self, mid_step: bool = False) -> None:
        """Apply what was posted, in order, and (unless a step's output is yet to be applied)
        run the calls; then deliver what that ended, and send the calls' replies."""
        messages = self.inbox.take()
        for message in messages:
            self._apply(message)
        calls, self._calls = ([], self._calls) if mid_step else (self._calls, [])
        for call in calls:
            try:
                self._replies.append((call.reply, call.work(), None))
            except BaseException as error:  # noqa: BLE001 - handed back to the caller, raised there
                self._replies.append((call.reply, None, error))
        if messages or calls:
            self._note_waiting()
            self._deliver()
            replies, self._replies = self._replies, []
            for reply, value, error in replies:
                if error is None:
                    reply.set_result(value)
                else:
                    reply.set_exception(error)

    def _apply(self, message: Message) -> None:
        match message:
            case Call():
                self._calls.append(message)
            case Cancel(None):
                self.cancel_all()
            case Cancel(request_id):
                self.cancel(request_id)
            case Arrive(handle) if handle.id in self.deliveries.handles:
                self.engine.record_rejection()
                self.deliveries.reject(handle, f"request id {handle.id!r} is already waiting or running")
            case Arrive(handle):
                self.deliveries.handles[handle.id] = handle
                self._preparing[handle.id] = False
            case Prepared(handle, seq) if self.deliveries.handles.get(handle.id) is handle:  # not a rejected duplicate
                self._queue(handle, seq)

    def _queue(self, handle: RequestHandle, seq: Sequence | None) -> None:
        """Queue a prepared request (None: its caller ended it), cancelled at once where a
        cancel reached it while it was prepared."""
        was_cancelled = self._preparing.pop(handle.id)
        if seq is None:
            del self.deliveries.handles[handle.id]
            self.engine.record_rejection()
        else:
            self.engine.add(seq)
            if was_cancelled:
                self.engine.abort(handle.id)  # a waiting request: it ends here, never runs

    def cancel(self, request_id: str) -> bool:
        if request_id in self._preparing:
            self._preparing[request_id] = True
            return True
        if self.engine.abort(request_id):
            return True
        logger.info("cancel(%r): no such waiting or running request", request_id)
        return False

    def cancel_all(self) -> int:
        num_preparing = sum(not was_cancelled for was_cancelled in self._preparing.values())
        self._preparing = dict.fromkeys(self._preparing, True)
        return num_preparing + self.engine.abort_all()

    def _note_waiting(self) -> None:
        self.inbox.note_waiting(len(self._preparing) + len(self.engine.scheduler.waiting))

    def _publish(self, force: bool = False) -> None:
        """A new latest snapshot once the last is PUBLISH_INTERVAL_S old, or the engine is idle
        (one costs about 0.3 ms at 64 slots: too much for every step)."""
        now = time.perf_counter()
        if force or not self.engine.has_work or now - self._published_at >= PUBLISH_INTERVAL_S:
            self.latest_snapshot, self._published_at = self.engine.snapshot(now), now

    def _deliver(self, tell: bool = True) -> None:
        """Deliver what the engine produced (a request whose callback raised fails alone), and
        tell the listeners."""
        for request_id, message in self.deliveries.deliver(self.engine.take_output()).items():
            self.engine.fail_request(request_id, message)
        if tell:
            self.deliveries.tell()

    def _stop(self, error: Exception) -> None:
        """The engine cannot go on: every request ends with the reason, new ones are refused
        with it, and the callers waiting for a reply are told."""
        reason = (first_line(error) if isinstance(error, EngineFailure)  # a bug's own words stay in the log
                  else f"internal error ({type(error).__name__}; the log has its traceback)")
        logger.error("the engine stopped: %s", reason, exc_info=error)
        self.failure = reason
        messages = self.inbox.take(stop=True)
        calls = self._calls + [message for message in messages if isinstance(message, Call)]
        for reply in [reply for reply, _, _ in self._replies] + [call.reply for call in calls]:
            reply.set_exception(EngineStopped(self.failure_message))
        try:
            self.engine.fail_all(self.failure_message)
            self._deliver()
            self._publish(force=True)
        except Exception:  # noqa: BLE001 - the handles are ended below whatever the engine's state
            logger.exception("failing the requests in the engine failed")
        arrived = [message.handle for message in messages if isinstance(message, Arrive)]
        remaining, self.deliveries.handles = list(self.deliveries.handles.values()), {}
        self.deliveries.fail(remaining + arrived, self.failure_message)
