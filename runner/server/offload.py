"""Blocking work off the server's event loop, on threads of its own: one kind cannot starve another.

Preparing a request (rendering its prompt, tokenizing it, compiling its schema or tool grammar)
is CPU work that may take seconds; file and database work is short but must not queue behind
it. Each has a bounded pool of its own, so six new schemas never hold up a /v1/files list.
Their threads are daemons: a compile that never ends cannot hold the process at exit.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import INVALID_REQUEST, OVERLOADED, ApiError

logger = logging.getLogger("multiseq.server")

T = TypeVar("T")
BUSY_RETRY_AFTER_SECONDS = 2  # as the queue-full 503 says


@dataclass(frozen=True)
class _Work:
    future: Future
    function: Callable[..., Any]
    args: tuple[Any, ...]


class DaemonExecutor(Executor):
    """A bounded pool of daemon threads, started as work needs them (concurrent.futures' own
    pool joins its threads at exit, however long they run)."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError(f"a pool needs at least one thread, got {max_workers}")
        self.max_workers = max_workers
        self.name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # one count per thread waiting for work
        self._lock = threading.Lock()
        self._is_shut_down = False

    def submit(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future:
        if kwargs:
            raise TypeError("DaemonExecutor.submit takes positional arguments only")
        future: Future = Future()
        with self._lock:
            if self._is_shut_down:
                raise RuntimeError(f"the {self.name} pool is shut down")
            self._work.put(_Work(future, function, args))
            # concurrent.futures' rule: a thread waiting for work takes it, else a new one if allowed.
            if not self._idle.acquire(timeout=0) and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._serve, name=f"{self.name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            if work.future.set_running_or_notify_cancel():  # False: cancelled while it waited
                try:
                    work.future.set_result(work.function(*work.args))
                except BaseException as error:  # noqa: BLE001 - the caller gets it through the future
                    work.future.set_exception(error)
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once they finish their work (work still queued is cancelled).
        wait=True waits for them; a stuck one is never waited for at exit either way."""
        with self._lock:
            if self._is_shut_down:
                return
            self._is_shut_down = True
            threads = list(self._threads)
        while True:  # what no thread took yet will never run
            try:
                work = self._work.get_nowait()
            except queue.Empty:
                break
            if work is not None:
                work.future.cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()

    @property
    def num_threads(self) -> int:
        return len(self._threads)


class Offload:
    """The threads of one server: `prepare` for requests' CPU work (bounded in time too), `io`
    for files and the database."""

    def __init__(self, prepare_threads: int, io_threads: int, prepare_timeout_s: float) -> None:
        self.prepare_executor = DaemonExecutor(prepare_threads, "multiseq-prepare")
        self.io_executor = DaemonExecutor(io_threads, "multiseq-io")
        self.prepare_timeout_s = prepare_timeout_s

    async def io(self, function: Callable[..., T], *args: Any) -> T:
        """Run file or database work off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.io_executor, function, *args)

    async def prepare(self, function: Callable[..., T], *args: Any,
                      on_abandoned: Callable[[Future], None] | None = None) -> T:
        """Run a request's preparation off the event loop, within the time limit. Past it the
        client gets an ApiError: 503 when the work never started (the pool was busy with other
        requests), 400 when it ran that long (a schema or a tool set too hard to compile). Python
        cannot stop a running thread: the work goes on, and on_abandoned(future) is called when
        it ends (to undo what it did)."""
        future = self.prepare_executor.submit(function, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.prepare_timeout_s)
        except TimeoutError:
            if future.cancel():  # it never started (True too when wait_for cancelled it)
                raise ApiError(503, f"The server is busy preparing other requests: this one did not start within "
                                    f"{self.prepare_timeout_s:g} s. Retry later.", OVERLOADED,
                               code="prepare_queue_timeout", headers={"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)}) from None
            logger.warning("preparing a request took longer than %g s; its client was told so", self.prepare_timeout_s)
            if on_abandoned is not None:
                future.add_done_callback(on_abandoned)
            raise ApiError(400, f"Preparing the request (rendering its prompt, compiling its response_format schema "
                                f"or its tools' grammar) took longer than this server's limit of "
                                f"{self.prepare_timeout_s:g} s; simplify the schema or the tools.", INVALID_REQUEST,
                           code="prepare_timeout") from None

    def shutdown(self) -> None:
        """Stop both executors without waiting: a stuck compile must not hold the server's exit."""
        self.prepare_executor.shutdown(wait=False)
        self.io_executor.shutdown(wait=False)
