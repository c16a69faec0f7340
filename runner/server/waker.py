"""Waking the serving event loop from the engine's thread without handing it the GIL.

`loop.call_soon_threadsafe` wakes the loop by writing to a socket, and Python lets go of the
GIL around that write: the loop's thread, woken by it, takes the GIL, and the engine's thread
waits for it back before it can start its next decode. Written through a C call that keeps the
GIL (ctypes.PyDLL), the wake-up lets the engine's thread go on to llama_decode, which lets go of
the GIL while it computes: the loop then runs beside the decode instead of between two.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
from collections.abc import Callable


def _write_holding_the_gil() -> Callable[[int, bytes, int], int] | None:
    """libc's write(2) called without letting go of the GIL, or None where there is no libc
    to load this way (then the loop is woken as asyncio wakes it)."""
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError, TypeError):
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    return write


class LoopWaker:
    """Calls `callback` on `loop` once after one or more wake() calls from any thread. Made on
    the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._lock = threading.Lock()  # a pipe is never closed under a write: its number could be reused
        self._write = _write_holding_the_gil()
        self._pipe: tuple[int, int] | None = None
        if self._write is not None:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)  # a full pipe already holds a wake-up: that write may fail
            try:
                loop.add_reader(read_fd, self._on_readable)
            except NotImplementedError:  # a loop that cannot watch a pipe (Windows' proactor)
                os.close(read_fd)
                os.close(write_fd)
                self._write = None
            else:
                self._pipe = read_fd, write_fd

    def wake(self) -> None:
        """From any thread: have the callback run on the loop (RuntimeError once closed)."""
        if self._write is None:
            self._loop.call_soon_threadsafe(self._callback)
            return
        with self._lock:
            if self._pipe is None:
                raise RuntimeError("the loop waker is closed")
            self._write(self._pipe[1], b"\0", 1)

    def _on_readable(self) -> None:
        with self._lock:
            if self._pipe is None:
                return
            try:
                while os.read(self._pipe[0], 4096):
                    pass
            except BlockingIOError:
                pass
        self._callback()

    def close(self) -> None:
        """Stop watching the pipe, on the loop's thread (from another, once the loop gets to it)."""
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        try:
            on_the_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_the_loop = False
        if on_the_loop or self._loop.is_closed():
            _release(self._loop, pipe)
            return
        try:
            self._loop.call_soon_threadsafe(_release, self._loop, pipe)
        except RuntimeError:  # closed meanwhile
            _release(self._loop, pipe)


def _release(loop: asyncio.AbstractEventLoop, pipe: tuple[int, int]) -> None:
    if not loop.is_closed():
        loop.remove_reader(pipe[0])
    for fd in pipe:
        os.close(fd)
