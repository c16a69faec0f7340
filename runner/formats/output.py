"""Where result lines go: a file (checked before the model loads) or standard output.

Each line is one complete write handed to the operating system at once. A write that fails
(a full disk, a closed pipe) raises OutputError, which stops the run.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO

from .resume import record_succeeded


def encode_record(record: dict[str, Any]) -> bytes:
    """One result line as UTF-8. Text holding a lone surrogate (JSON escapes allow them in
    the input) is written back as its JSON escape, never as bytes that are not UTF-8."""
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")


class OutputError(Exception):
    """Results could not be written (disk full, a closed pipe): the run has to stop."""


class ResultSink:
    """Where result lines go, one complete line per write, each handed to the operating
    system at once, so a killed run loses nothing that finished. A file is opened for
    appending before the model loads (to find an unwritable path early, without clearing a
    file the run may never replace); start() empties it when the run is not a resume.
    A durable sink also waits for each line to reach the disk (fsync), so that not even a
    power cut loses a line it reported written (the server's Batch API counts on that)."""

    def __init__(self, stream: BinaryIO, name: str, durable: bool = False) -> None:
        self._stream = stream
        self.name = name
        self._durable = durable
        self.num_lines = 0  # lines written through this sink

    @classmethod
    def open_file(cls, path: Path, durable: bool = False) -> ResultSink:
        return cls(path.open("ab", buffering=0), str(path), durable)

    @classmethod
    def stdout(cls) -> ResultSink:
        sys.stdout.flush()
        return cls(sys.stdout.buffer, "standard output")

    def start(self, keep_existing: bool) -> None:
        fileno = self._fileno()
        if not keep_existing and fileno is not None and stat.S_ISREG(os.fstat(fileno).st_mode):
            self._guarded(lambda: self._stream.truncate(0))

    def write_line(self, data: bytes) -> None:
        self._guarded(lambda: self._write_all(data))
        self.num_lines += 1

    def write_lines(self, lines: list[bytes]) -> None:
        """Several whole lines in one write (and, durable, one fsync for them all)."""
        data = b"".join(lines)
        self._guarded(lambda: self._write_all(data))
        self.num_lines += len(lines)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._stream.write(view)
            view = view[written if written is not None else len(view):]
        self._stream.flush()
        if self._durable:
            os.fsync(self._stream.fileno())

    def _guarded(self, action) -> None:
        try:
            action()
        except OSError as error:
            raise OutputError(f"cannot write results to {self.name}: {error.strerror or error}") from None

    def _fileno(self) -> int | None:
        try:
            return self._stream.fileno()
        except (OSError, ValueError, AttributeError):  # an in-memory stream (tests) has none
            return None

    def close(self) -> None:
        if self._stream is not sys.stdout.buffer:
            self._stream.close()


class ResultWriter:
    """Writes one JSON line per finished item to a sink, and the lines that did not succeed to
    errors_sink when there is one (as OpenAI splits its output and error files). In input
    order, a line waits only for the lines before it; an item that never started is skipped, so
    the lines after it follow. Items are numbered by the caller in input order (their position)."""

    def __init__(self, sink: ResultSink, keep_input_order: bool, errors_sink: ResultSink | None = None) -> None:
        self._sink = sink
        self._errors_sink = errors_sink
        self._keep_input_order = keep_input_order
        self._pending: dict[int, tuple[ResultSink, bytes] | None] = {}  # position -> line (None: skipped)
        self._next_position = 0
        self.num_written = 0

    @property
    def num_held(self) -> int:
        """Lines finished but waiting for an earlier one (input order only)."""
        return len(self._pending)

    def write(self, record: dict[str, Any], position: int) -> None:
        line = (self._sink_for(record), encode_record(record))
        if not self._keep_input_order:
            self._write_line(line)
            return
        self._pending[position] = line
        self._release()

    def _sink_for(self, record: dict[str, Any]) -> ResultSink:
        if self._errors_sink is not None and not record_succeeded(record):
            return self._errors_sink
        return self._sink

    def skip(self, position: int) -> None:
        """The item at `position` gets no line (it never started)."""
        if self._keep_input_order:
            self._pending[position] = None
            self._release()

    def _release(self) -> None:
        while self._next_position in self._pending:
            line = self._pending.pop(self._next_position)
            self._next_position += 1
            if line is not None:
                self._write_line(line)

    def flush_pending(self) -> None:
        """Write whatever input-order lines still wait (an interrupted run ends with gaps)."""
        for position in sorted(self._pending):
            line = self._pending.pop(position)
            if line is not None:
                self._write_line(line)

    def _write_line(self, line: tuple[ResultSink, bytes]) -> None:
        sink, data = line
        sink.write_line(data)
        self.num_written += 1
