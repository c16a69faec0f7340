"""A running batch's result lines made durable in groups, off the thread that feeds the runner.

Writing and fsyncing each line as its request finished (and then recording the counts, a
second fsync) kept the batch's run loop from refilling the runner while the disk worked. Here
the run loop only hands a finished line over; a committer thread writes everything handed over
since its last commit as one write per file, fsyncs each file once, and only then records the
batch's counts, at most once per COMMIT_INTERVAL_SECONDS.

Exactly once is unchanged, because the result files stay the only record of what is done: a
crash loses the lines not yet written (the next start runs them again), a group cut in the
middle of its write leaves whole lines (done) and at most one torn line (cut at the next
start), and counts that lag the files are recomputed from the files at the next start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..formats.output import ResultSink

# Commits per second at most: each costs an fsync of each result file and one of the database.
COMMIT_INTERVAL_SECONDS = 0.05


class QueuedSink:
    """What the batch's ResultWriter writes to: a line joins the committer's next group."""

    def __init__(self, committer: GroupCommitter, sink: ResultSink) -> None:
        self._committer = committer
        self._sink = sink
        self.name = sink.name
        self.num_lines = 0  # lines handed over (not all on disk yet)

    def write_line(self, data: bytes) -> None:
        self._committer.add(self._sink, data)
        self.num_lines += 1


class GroupCommitter:
    """Commits the lines for `output` and `errors` in groups from a thread of its own, then
    calls on_committed(output lines, error lines), the lines on disk so far. A failure to write
    is raised by the next add() and by close(); the lines after it are never written."""

    def __init__(self, output: ResultSink, errors: ResultSink, on_committed: Callable[[int, int], None]) -> None:
        self._sinks = (output, errors)
        self._on_committed = on_committed
        self.output = QueuedSink(self, output)
        self.errors = QueuedSink(self, errors)
        self._changed = threading.Condition()  # guards _waiting, _is_closing and _error
        self._waiting: dict[ResultSink, list[bytes]] = {output: [], errors: []}
        self._is_closing = False
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._commit_loop, name="multiseq-batch-commit", daemon=True)
        self._thread.start()

    def add(self, sink: ResultSink, data: bytes) -> None:
        """Queue one line for `sink`; raises what stopped the commits, if anything did."""
        with self._changed:
            if self._error is not None:
                raise self._error
            self._waiting[sink].append(data)
            self._changed.notify()

    def close(self) -> None:
        """Commit what is queued, stop the thread, and raise what stopped the commits."""
        with self._changed:
            self._is_closing = True
            self._changed.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _has_waiting(self) -> bool:
        return any(self._waiting.values())

    def _commit_loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._has_waiting() or self._is_closing)
                if not self._has_waiting():
                    return  # closing, and everything is committed
                group = {sink: lines for sink, lines in self._waiting.items() if lines}
                self._waiting = {sink: [] for sink in self._sinks}
            try:
                self._commit(group)
            except Exception as error:  # noqa: BLE001 - handed to the run, which fails the batch
                with self._changed:
                    self._error = error
                return
            with self._changed:  # let lines gather for the next group (closing commits at once)
                self._changed.wait_for(lambda: self._is_closing, timeout=COMMIT_INTERVAL_SECONDS)

    def _commit(self, group: dict[ResultSink, list[bytes]]) -> None:
        for sink in self._sinks:
            if sink in group:
                sink.write_lines(group[sink])
        output, errors = self._sinks
        self._on_committed(output.num_lines, errors.num_lines)
