"""Ctrl-C during a batch-run: the first stops the run in an orderly way, a second exits at once.

Before the run starts (reading the file, loading the model) there is nothing to save, so the
first Ctrl-C raises KeyboardInterrupt where the program is, and the command reports it in a
line. Once a run listens, the first Ctrl-C calls it instead (it cancels and writes what ran).
While the model loads, a Ctrl-C is held and raised once the load returns: llama.cpp calls
back into Python as it loads (its log lines), and an exception raised in such a callback is
printed by ctypes and then dropped, so the Ctrl-C would be lost behind a traceback.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_INTERRUPTED = 130


class Interrupts:
    """SIGINT handling for the life of a command (installed only on the main thread, the only
    one that receives signals)."""

    def __init__(self) -> None:
        self.count = 0
        self._listener: Callable[[], None] | None = None
        self._previous = None
        self._installed = False

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc_info) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    def listen(self, listener: Callable[[], None]) -> None:
        """From now on, the first Ctrl-C calls `listener` (which must be safe in a signal handler)."""
        self._listener = listener

    @contextmanager
    def held(self) -> Iterator[HeldInterrupt]:
        """A first Ctrl-C inside the block is noted, not raised (a second still exits at once).
        If the block fails after one, KeyboardInterrupt replaces its error; if it succeeds,
        the caller reads `interrupted`, undoes what the block made, and raises it."""
        held, previous = HeldInterrupt(), self._listener
        self._listener = held.note
        try:
            yield held
        except Exception:
            if held.interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            self._listener = previous

    def _handle(self, _signum, _frame) -> None:
        self.interrupt()

    def interrupt(self) -> None:
        """What a Ctrl-C does (the signal handler calls this; so may a test)."""
        self.count += 1
        if self.count > 1:
            os._exit(EXIT_INTERRUPTED)  # the user insists: no cleanup, no waiting
        if self._listener is None:
            raise KeyboardInterrupt
        self._listener()


class HeldInterrupt:
    """Whether a Ctrl-C came while Interrupts.held() was in force."""

    def __init__(self) -> None:
        self.interrupted = False

    def note(self) -> None:
        self.interrupted = True
