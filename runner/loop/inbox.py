"""The runner's inbox: what other threads post for its worker thread, and the bookkeeping that
goes with it, all under one small lock (the inbox lock) that nobody holds for longer than a list
operation; its condition wakes the idle worker.

The worker drains the posted messages into the engine (Inbox.apply_to, under the engine lock)
before it schedules a step and before it applies a step's output, and runs the posted commands
between two steps. See multiseq.loop.runner for the whole set of locking rules.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .delivery import RequestHandle
from .engine import Engine
from .sequence import Sequence

logger = logging.getLogger("multiseq.runner")


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


class Command:
    """Work for the stepping thread, run between two steps; the caller waits for its value."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        """The command will never run: its caller gets `error`."""
        self.error = error
        self.done.set()

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


@dataclass(frozen=True)
class Admission:
    """What admit() made of a new request: its handle, and whether its id was already taken
    (then the handle is not registered and the request must be rejected)."""

    handle: RequestHandle
    is_duplicate: bool


class Inbox:
    """Messages and commands for the worker, the requests being tokenized, the handles of every
    request waiting or running, the worker thread itself, and the engine's queue length as of
    its last change: everything another thread may read or post without the engine lock."""

    def __init__(self) -> None:
        # The inbox lock, held for list operations only; its condition wakes the idle worker.
        self.lock = threading.Condition(threading.Lock())
        self._messages: deque[_Message] = deque()  # what the worker applies before its next step
        self._commands: deque[Command] = deque()  # backend work for the stepping thread
        self.handles: dict[str, RequestHandle] = {}  # every request waiting or running, by id
        # Requests submit() is still tokenizing: known by id, not yet in the engine, and the
        # ones among them a cancel reached meanwhile (they end as soon as they are queued).
        self._tokenizing: set[str] = set()
        self._cancelled_while_tokenizing: set[str] = set()
        # The engine's waiting queue and whether it has work, as of the last change to them
        # (under the inbox lock: the worker reads them while another thread may hold the engine).
        self._num_queued = 0
        self._has_engine_work = False
        self._num_submitted = 0
        self._worker: threading.Thread | None = None
        self.is_closing = False
        self._stopped: BaseException | None = None  # the engine stopped: why commands are refused

    # --- requests ----------------------------------------------------------------------------

    def admit(self, request_id: str | None, new_handle: Callable[[str], RequestHandle]) -> Admission:
        """Name a new request (numbered when it has no id), make its handle and, unless the id is
        taken, register it as being tokenized. RuntimeError once the runner is closing."""
        with self.lock:
            if self.is_closing:
                raise RuntimeError("the runner is closed")
            if request_id is None:
                request_id = f"req-{self._num_submitted}"
            self._num_submitted += 1
            handle = new_handle(request_id)
            is_duplicate = request_id in self.handles
            if not is_duplicate:
                self.handles[request_id] = handle
                self._tokenizing.add(request_id)
        return Admission(handle, is_duplicate)

    def forget(self, request_id: str) -> None:
        """The request failed to be tokenized: it is no longer known."""
        with self.lock:
            self._stop_tokenizing(request_id)
            del self.handles[request_id]

    def post_request(self, seq: Sequence) -> bool:
        """Post the tokenized request for the engine's queue (already cancelled when a cancel or a
        close reached it while it was tokenized). Returns whether a worker thread drains the inbox."""
        with self.lock:
            was_cancelled = self._stop_tokenizing(seq.id) or self.is_closing
            return self._post(_Enqueue(seq, was_cancelled))

    def _stop_tokenizing(self, request_id: str) -> bool:
        """The request is tokenized (or failed to be); whether a cancel reached it meanwhile.
        Called under the inbox lock."""
        self._tokenizing.discard(request_id)
        if request_id in self._cancelled_while_tokenizing:
            self._cancelled_while_tokenizing.discard(request_id)
            return True
        return False

    def cancel_if_tokenizing(self, request_id: str) -> bool:
        """Note a cancel for a request being tokenized (it ends as soon as it is queued); whether it was."""
        with self.lock:
            if request_id in self._tokenizing:
                self._cancelled_while_tokenizing.add(request_id)
                return True
            return False

    def cancel_tokenizing(self) -> int:
        """Note a cancel for every request being tokenized; how many a cancel had not reached yet."""
        with self.lock:
            num_tokenizing = len(self._tokenizing - self._cancelled_while_tokenizing)
            self._cancelled_while_tokenizing |= self._tokenizing
            return num_tokenizing

    def post_cancel(self, request_id: str) -> bool:
        """Post a cancel for one request (or note it, while it is tokenized); whether it is known."""
        with self.lock:
            if request_id in self._tokenizing:
                self._cancelled_while_tokenizing.add(request_id)
            else:
                self._messages.append(_Cancel(request_id))
            self.lock.notify_all()
            return request_id in self.handles

    def post_cancel_all(self) -> None:
        """Post a cancel of everything queued or running, and note one for what is being tokenized."""
        with self.lock:
            self._cancelled_while_tokenizing |= self._tokenizing
            self._post(_CancelAll())

    def _post(self, message: _Message) -> bool:
        """Append a message and wake the worker (under the inbox lock); whether there is one."""
        self._messages.append(message)
        self.lock.notify_all()
        return self._worker is not None

    @property
    def num_waiting(self) -> int:
        """Requests being tokenized, posted, or in the engine's queue."""
        with self.lock:
            num_posted = sum(isinstance(message, _Enqueue) for message in self._messages)
            return self._num_queued + num_posted + len(self._tokenizing)

    # --- the engine side (the caller holds the engine lock) -------------------------------------

    def apply_to(self, engine: Engine) -> bool:
        """Apply what was posted, in order; whether anything was. The queue's length changes
        under the inbox lock too, so num_waiting never misses a request between the two."""
        with self.lock:
            messages, self._messages = self._messages, deque()
            for message in messages:
                if isinstance(message, _Enqueue):
                    engine.add(message.seq)
                    if message.is_cancelled:
                        engine.abort(message.seq.id)  # a waiting request: it ends here, never runs
                elif isinstance(message, _Cancel):
                    if not engine.abort(message.request_id):
                        logger.info("cancel(%r): no such waiting or running request", message.request_id)
                else:
                    engine.abort_all()
            self._num_queued, self._has_engine_work = len(engine.scheduler.waiting), engine.has_work
        return bool(messages)

    def note_engine_state(self, engine: Engine) -> None:
        """The engine's queue or slots changed: num_waiting and the worker's idea of whether
        work is left follow."""
        num_queued, has_work = len(engine.scheduler.waiting), engine.has_work
        with self.lock:
            self._num_queued, self._has_engine_work = num_queued, has_work

    # --- commands --------------------------------------------------------------------------

    def post_command(self, command: Command) -> bool:
        """Queue work for the stepping thread; whether a worker thread runs it. RuntimeError
        once the runner is closing."""
        with self.lock:
            if self.is_closing:
                raise RuntimeError("the runner is closed")
            if self._stopped is not None:
                raise self._stopped
            self._commands.append(command)
            self.lock.notify_all()
            return self._worker is not None

    def stop(self, error: BaseException) -> None:
        """The engine stopped for good: the commands waiting, and any posted later, fail with
        `error` (nothing will run them)."""
        with self.lock:
            self._stopped = error
            commands, self._commands = self._commands, deque()
        for command in commands:
            command.fail(error)

    def take_handles(self) -> list[RequestHandle]:
        """Every handle not yet given its result, taken away (the engine stopped: they are
        ended by the caller)."""
        with self.lock:
            handles = list(self.handles.values())
            self.handles.clear()
            self._tokenizing.clear()
            self._messages.clear()
            return handles

    def take_commands(self) -> deque[Command]:
        with self.lock:
            commands, self._commands = self._commands, deque()
            return commands

    def has_posted(self) -> bool:
        """Whether messages or commands wait for the stepping thread."""
        with self.lock:
            return bool(self._commands) or bool(self._messages)

    # --- the worker thread -----------------------------------------------------------------

    def start_worker(self, loop: Callable[[], None]) -> None:
        """Start the worker thread running `loop`, unless it runs or the runner is closing."""
        with self.lock:
            # A submit that was tokenizing while close() ran must not start a worker afterwards.
            if self._worker is None and not self.is_closing:
                self._worker = threading.Thread(target=loop, name="multiseq-runner", daemon=True)
                self._worker.start()

    def is_worker_thread(self) -> bool:
        return threading.current_thread() is self._worker

    def wait_for_work(self) -> bool:
        """The worker waits here until there is work or the runner closes; False when it closed
        and nothing is left to do (the worker ends)."""
        with self.lock:
            while not (self._has_engine_work or self._messages or self._commands or self.is_closing):
                self.lock.wait()
            return not (self.is_closing and not (self._has_engine_work or self._messages or self._commands))

    def close(self) -> threading.Thread | None:
        """Refuse new requests and commands, wake the worker to finish; the worker, if any."""
        with self.lock:
            self.is_closing = True
            self.lock.notify_all()
            return self._worker
