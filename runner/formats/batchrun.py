"""One batch run: prompts streamed from a file into a runner, results streamed out.

Items are read lazily and only a bounded window of them is open at a time (read but not yet
written: queued, running, or finished and waiting for an earlier line in input order), so
memory does not grow with the file and the first results come as soon as the first prompts
are decoded. interrupt() (the CLI calls it on the first Ctrl-C) stops reading and cancels
everything: running requests are written with their partial text as "cancelled"; requests
that never started are not written, only counted, and --resume runs them.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

from ..request import Request, Result
from ..loop.runner import Runner
from ..loop.sequence import CANCELLED_BEFORE_START
from .output import ResultWriter
from .reader import PromptFormat, PromptItem
from .records import record_for
from .summary import RunTally

WINDOW_PER_SLOT = 4  # open items per slot: enough queued to refill a slot the moment it frees
_INTERRUPT = object()
# How often the display is ticked while no result arrives.
TICK_SECONDS = 0.25


def default_window(parallel: int) -> int:
    return WINDOW_PER_SLOT * parallel


def with_free_id(request: Request, taken: Container[str]) -> Request:
    """The request under an id not in `taken`. Choice k of line `x` runs as `x#k`, which
    another line may have as its own id; the runner's ids must differ (output lines carry the
    items' ids, whatever the runner's were)."""
    request_id, copy = request.id, 1
    while request_id in taken:
        copy += 1
        request_id = f"{request.id} ({copy})"
    return request if request_id == request.id else dataclasses.replace(request, id=request_id)


@dataclass
class _Open:
    """An item submitted to the runner (a request per choice), with its place in the input and
    the results of the choices that have ended."""

    item: PromptItem
    position: int
    request_ids: list[str] = field(default_factory=list)  # the runner's id of each choice, in order
    results: dict[str, Result] = field(default_factory=dict)

    @property
    def is_complete(self) -> bool:
        return len(self.results) == self.item.n

    def ordered_results(self) -> list[Result]:
        return [self.results[request_id] for request_id in self.request_ids]


@dataclass(frozen=True)
class RunOutcome:
    tally: RunTally
    interrupted: bool
    wall_s: float
    engine_failure: str | None = None  # the runner stopped after a failure: what is left did not run


class BatchRun:
    """Stream `items` (the items of this run, in input order; `num_items` of them) through the
    runner, at most `window` open at once, writing each result as it arrives."""

    def __init__(self, runner: Runner, items: Iterator[PromptItem], num_items: int, writer: ResultWriter,
                 file_format: PromptFormat, model_name: str, window: int) -> None:
        assert window >= 1
        self.runner = runner
        self.writer = writer
        self.file_format = file_format
        self.model_name = model_name
        self._items = items
        self._num_items = num_items
        self._window = window
        self._open: dict[str, _Open] = {}  # the open item of each submitted request, by request id
        self._num_open_items = 0
        self._num_read = 0
        self._is_exhausted = False
        self._finished: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe in a signal handler
        self.interrupted = False
        self.tally = RunTally()

    def interrupt(self) -> None:
        """Stop the run soon (from any thread, or a signal handler)."""
        self.interrupted = True
        self._finished.put(_INTERRUPT)

    def execute(self, display) -> RunOutcome:
        """Run to the end of the items, or until interrupted. An OutputError (results could not
        be written) cancels everything and is raised."""
        started = time.perf_counter()
        completed = False
        try:
            self._loop(display)
            completed = True
        finally:
            if not completed:
                self._cancel_open()  # stop the work at once; the runner's close drains it
            else:
                self.writer.flush_pending()
        failure = self.runner.failure
        if self.interrupted or failure is not None:
            self.tally.add_not_started(max(0, self._num_items - self._num_read))
        return RunOutcome(self.tally, self.interrupted, time.perf_counter() - started, failure)

    def _loop(self, display) -> None:
        while True:
            self._fill(display)
            if not self._num_open_items and (self._is_exhausted or self.interrupted
                                             or self.runner.failure is not None):
                return
            try:
                message = self._finished.get(timeout=TICK_SECONDS)
            except queue.Empty:
                display.tick()
                continue
            if message is _INTERRUPT:
                self._cancel_open()
            else:
                self._on_result(message, display)

    def _num_open(self) -> int:
        return self._num_open_items + self.writer.num_held

    @property
    def num_open_requests(self) -> int:
        """Requests submitted and not yet handled (safe to read from any thread)."""
        return len(self._open)

    # --- what a run of another kind (the server's Batch API) changes ---------------------------

    def _cancel_open(self) -> None:
        """Stop the run's requests (on interrupt, or when the run fails). The runner is this
        run's alone here, so everything in it goes at once."""
        self.runner.cancel_all()

    def _runner_request(self, request: Request) -> Request:
        """A choice's request as the runner gets it (its id may still change, to be unique)."""
        return request

    def _leaves_unwritten(self, results: list[Result]) -> bool:
        """Whether an item's results get no line: here, an interrupted item that never started
        (--resume runs it); one cancelled while running is written with its partial text."""
        return self.interrupted and all(result.error == CANCELLED_BEFORE_START for result in results)

    def _fill(self, display) -> None:
        """Read items until the window is full. Bounded work per call (a file of bad lines
        takes no window room), so results, the display and Ctrl-C are seen in between."""
        for _ in range(self._window):
            if self._is_exhausted or self.interrupted or self._num_open() >= self._window:
                return
            if self.runner.failure is not None:  # nothing would run: the rest is left for --resume
                return
            item = next(self._items, None)
            if item is None:
                self._is_exhausted = True
                return
            position = self._num_read
            self._num_read += 1
            if item.is_valid:
                self._submit(_Open(item, position))
            else:
                self.tally.add_invalid()
                self._write(item, None, position, display)

    def _submit(self, entry: _Open) -> None:
        """Queue every choice of an item (n > 1: n requests of one prompt, whose prefill the
        runner shares)."""
        self._num_open_items += 1
        requests = []
        for request in entry.item.requests:
            requests.append(with_free_id(self._runner_request(request), self._open))
            self._open[requests[-1].id] = entry
            entry.request_ids.append(requests[-1].id)
        for request in requests:  # every id is registered before any result can arrive
            self.runner.submit(request, on_finish=self._finished.put)

    def _on_result(self, result: Result, display) -> None:
        entry = self._open.pop(result.id)
        entry.results[result.id] = result
        if not entry.is_complete:
            return
        self._num_open_items -= 1
        results = entry.ordered_results()
        if self._leaves_unwritten(results):
            self.writer.skip(entry.position)  # no line: a later run runs it
            self.tally.add_not_started()
            return
        for result in results:
            self.tally.add_result(result)
        self._write(entry.item, results, entry.position, display)

    def _write(self, item: PromptItem, results: list[Result] | None, position: int, display) -> None:
        self.writer.write(record_for(self.file_format, item, results, self.model_name), position)
        display.note_written()
        display.tick()
