"""What the engine's owner hands out: text pieces and results to the requests' handles, and a
word to the delivery listeners (a server's event loop) when it says so, once for all it handed
out since. All on the owner's thread (multiseq.loop.worker), but the rejection of a request that
could not be prepared, and the failure of requests posted after the engine stopped, on their
caller's thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

from .step_output import StepOutput, TextPiece
from ..errors import BackendError, RequestFault
from ..request import Result
from .scheduler import PromptDoesNotFit

logger = logging.getLogger("multiseq.runner")

_END_OF_STREAM = object()


class RequestHandle:
    """What submit() returns: iterate it for text pieces (when streaming), or wait for result()."""

    def __init__(self, request_id: str, stream: bool, on_finish: Callable[[Result], None] | None = None,
                 on_piece: Callable[[TextPiece], None] | None = None) -> None:
        self.id = request_id
        self._pieces: queue.SimpleQueue | None = queue.SimpleQueue() if stream else None
        self._done = threading.Event()
        self._result: Result | None = None
        self._on_finish, self._on_piece = on_finish, on_piece
        self.is_faulty = False  # on_piece raised: nothing more is emitted, the result still comes

    def emit(self, piece: TextPiece) -> None:
        if self._pieces is not None and piece.text:
            self._pieces.put(piece.text)
        if self._on_piece is not None:
            self._on_piece(piece)

    def finish(self, result: Result) -> None:
        if self._done.is_set():
            return  # ended already (the engine stopped while its result was on the way)
        self._result = result
        self._done.set()
        if self._pieces is not None:
            self._pieces.put(_END_OF_STREAM)
        if self._on_finish is not None:
            self._on_finish(result)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Result:
        """The final Result; request failures are in result.error, never raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running after {timeout} s")
        assert self._result is not None
        return self._result

    def __iter__(self) -> Iterator[str]:
        if self._pieces is None:
            raise RuntimeError("submit(request, stream=True) to iterate over text pieces")
        while (piece := self._pieces.get()) is not _END_OF_STREAM:
            yield piece


class Deliveries:
    """The handles of the requests the owner knows, by id, and the delivery listeners."""

    def __init__(self) -> None:
        self.handles: dict[str, RequestHandle] = {}  # the owner's alone: from arrival to result
        self._listeners: list[Callable[[], None]] = []  # replaced, never changed in place
        self._listeners_lock = threading.Lock()  # for the rare writer; readers take the list as it is
        self._is_untold = False  # something was handed out since the listeners were last told

    def deliver(self, output: StepOutput) -> dict[str, str]:
        """Hand pieces and results to their handles. A callback that raises fails its own
        request alone: the requests that could not take their pieces, and why (the caller
        fails them in the engine; nothing more reaches them until their result)."""
        faults: dict[str, str] = {}
        for piece in output.pieces:
            handle = self.handles.get(piece.request_id)
            if handle is not None and not handle.is_faulty:
                try:
                    handle.emit(piece)
                except Exception as error:  # noqa: BLE001 - the callback's fault is its request's
                    handle.is_faulty = True
                    faults[handle.id] = str(RequestFault("delivering its output", error))
                    logger.error("request %s failed: %s", handle.id, faults[handle.id], exc_info=error)
        for result in output.finished:
            if (handle := self.handles.pop(result.id, None)) is not None:
                fault = faults.get(handle.id)
                self._finish(handle, result if fault is None else result.failed_with(fault))
        self._is_untold |= bool(output.pieces or output.finished)
        return faults

    def _finish(self, handle: RequestHandle, result: Result) -> None:
        try:
            handle.finish(result)
        except Exception:  # noqa: BLE001 - the result is set before on_finish runs: only the callback failed
            logger.exception("request %s: on_finish failed", handle.id)
        # Marked untold once handed out: a rejection on a caller's thread, marked before its
        # on_finish ran, could be reset by the owner's tell in between and then never told.
        self._is_untold = True

    def fail(self, handles: list[RequestHandle], message: str) -> None:
        """End these handles with an error result (the engine stopped: no step will), and tell."""
        for handle in handles:
            self._finish(handle, Result.failed_before_start(handle.id, message))
        self.tell()

    def reject(self, handle: RequestHandle, error: str | Exception) -> None:
        """End a request that could not be queued, and tell. What it asked for (ValueError) or
        what the model cannot do with it (BackendError) is the caller's error, said as is;
        anything else is a bug, logged, and said as one."""
        if isinstance(error, PromptDoesNotFit):
            result = Result.rejected(handle.id, str(error), prompt_tokens=error.num_prompt)
        elif isinstance(error, (str, ValueError, BackendError)):
            result = Result.rejected(handle.id, str(error))
        else:
            logger.error("request %s could not be queued", handle.id, exc_info=error)
            result = Result.failed_before_start(handle.id, f"internal error: {type(error).__name__}")
        self._finish(handle, result)
        self.tell()

    def tell(self) -> None:
        """Tell the listeners, where something was handed out since they were last told."""
        if not self._is_untold:
            return
        self._is_untold = False
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the engine
                logger.exception("a delivery listener failed")

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners = [known for known in self._listeners if known is not listener]
