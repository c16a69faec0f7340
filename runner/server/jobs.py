"""One HTTP request in the engine: its choices as runner requests, bridged to the event loop.

The runner's worker thread hands each text piece and each result to a LoopDispatcher, one per
event loop, which collects them; after each step (a runner delivery listener, told as the next
decode begins) the dispatcher wakes the loop once (a LoopWaker: the wake-up keeps the GIL, so
the loop takes it while llama.cpp decodes), and on the loop routes each event to its request's
own asyncio queue: no thread, no polling, and at most one wake-up of the loop per step rather
than per token. With a stream interval, the loop takes what is held at most that often: a
stream then gets the pieces of several steps as one chunk, one write where there were several
(many streams on a fast model cost the loop, and the engine that shares its GIL and cores,
that much less). The handler (or the stream it returns) awaits that queue; when the client
goes away, the job cancels whatever of it is still waiting or running without waiting for the
engine (Runner.cancel_soon), ignores the pieces that still come for it, and the runner frees
the slot at its next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..formats.reader import PromptItem
from ..loop.step_output import TextPiece
from ..request import Result
from ..loop.runner import Runner
from .waker import LoopWaker

logger = logging.getLogger("multiseq.server")

# With an automatic stream interval, the chunks all streams together get per second at most:
# each costs the loop a chunk built and a write (about 45 us on a 2-core machine), so the loop
# spends at most a few percent of a core on them, and the engine that shares its GIL the rest.
# A take that fed N streams is followed by one no sooner than N / this: a few streams get every
# step, 64 streams on a fast model a chunk every 40 ms each.
MAX_CHUNKS_PER_SECOND = 1600
# Pieces a request's queue holds before its client counts as too slow to keep up: the request
# is then cancelled (a client that reads nothing at all is cut by the stream's send timeout).
MAX_QUEUED_EVENTS = 4096


@dataclass(frozen=True)
class PieceEvent:
    choice: int
    piece: TextPiece
    at: float  # when the worker handed it out (perf_counter)


@dataclass(frozen=True)
class ResultEvent:
    choice: int
    result: Result


class LoopDispatcher:
    """Hands the runner's events to one event loop: the runner's callbacks put() events here
    (on its thread), the runner's delivery listener flush()es, which asks the loop to take
    them, and on the loop each event goes to its job. The loop takes what is held no more
    often than every `interval_s` (0: whenever a step flushes; None: as many streams as the last
    take fed over MAX_CHUNKS_PER_SECOND), and never later than that after a flush."""

    def __init__(self, runner: Runner, loop: asyncio.AbstractEventLoop, interval_s: float | None = 0.0) -> None:
        self.runner = runner
        self.loop = loop
        self.interval_s = interval_s
        self._next_interval_s = interval_s or 0.0
        self._pending: list[tuple[Job, PieceEvent | ResultEvent]] = []
        self._lock = threading.Lock()  # put() and flush() may come from different threads
        self._is_take_asked = False  # the loop was asked to take what is held, and has not yet
        self._last_take = -math.inf  # loop.time() of the last take
        self._waker = LoopWaker(loop, self._take_when_due)
        runner.add_delivery_listener(self.flush)

    def put(self, job: Job, event: PieceEvent | ResultEvent) -> None:
        """On the runner's thread (or a submitting one): hold an event until the loop takes it."""
        with self._lock:
            self._pending.append((job, event))

    def flush(self) -> None:
        """After a delivery: ask the loop to take what is held, unless it was asked already (the
        events of later steps join those it will take). A closed loop, at shutdown, has no one
        left to tell."""
        with self._lock:
            if not self._pending or self._is_take_asked:
                return
            self._is_take_asked = True
        try:
            self._waker.wake()
        except RuntimeError:
            pass

    def _take_when_due(self) -> None:
        """On the loop: take now, or once the interval since the last take has passed."""
        wait = self._last_take + self._next_interval_s - self.loop.time()
        if wait > 0:
            self.loop.call_later(wait, self._take)
        else:
            self._take()

    def _take(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
            self._is_take_asked = False
        self._last_take = self.loop.time()
        if self.interval_s is None:
            self._next_interval_s = len({id(job) for job, _ in events}) / MAX_CHUNKS_PER_SECOND
        _route(events)

    def close(self, take_held: bool = False) -> None:
        """Stop listening to the runner (the loop is done; or with take_held, on the loop, the
        runner is: what it delivered last goes to its jobs first)."""
        self.runner.remove_delivery_listener(self.flush)
        if take_held:
            self._take()
        self._waker.close()


def _route(events: list[tuple[Job, PieceEvent | ResultEvent]]) -> None:
    """On the loop: each job its events in order, the consecutive pieces of one choice joined
    (a take that spans several steps hands each stream one piece, not one per step)."""
    by_job: dict[Job, list[PieceEvent | ResultEvent]] = {}
    for job, event in events:
        by_job.setdefault(job, []).append(event)
    for job, job_events in by_job.items():
        for event in _joined_runs(job_events):
            job.receive(event)


def _joined_runs(events: list[PieceEvent | ResultEvent]) -> list[PieceEvent | ResultEvent]:
    """The events in order, each run of consecutive pieces of one choice as one piece."""
    out: list[PieceEvent | ResultEvent] = []
    run: list[PieceEvent] = []
    for event in events:
        if run and not (isinstance(event, PieceEvent) and event.choice == run[0].choice):
            out.append(_joined(run))
            run = []
        if isinstance(event, PieceEvent):
            run.append(event)
        else:
            out.append(event)
    if run:
        out.append(_joined(run))
    return out


class Job:
    """The runner requests of one HTTP request (one per choice) and the events they produce."""

    def __init__(self, runner: Runner, item: PromptItem, dispatcher: LoopDispatcher, body_id: str,
                 streams: bool = True) -> None:
        self.runner = runner
        self.streams = streams  # its pieces are streamed (else only its results are awaited)
        self.item = item
        self.body_id = body_id
        # Bounded: MAX_QUEUED_EVENTS pieces, and room for every choice's result beyond them.
        self.events: asyncio.Queue[PieceEvent | ResultEvent] = asyncio.Queue(MAX_QUEUED_EVENTS + item.n)
        self.is_overrun = False  # its client fell MAX_QUEUED_EVENTS pieces behind: cancelled
        self.request_ids = [f"{body_id}-{index}" for index in range(item.n)]
        self.results: dict[int, Result] = {}
        self.arrived_at = time.perf_counter()
        self._dispatcher = dispatcher
        self._cancelled: set[int] = set()  # choices this job cancelled: their pieces are dropped
        self._handles = []
        self.num_dispatched = 0  # choices handed to the runner (or being handed) so far

    def submit(self, before_each: Callable[[], None]) -> None:
        """Queue every choice, calling before_each() just before the runner takes one (from
        then on it counts the request as waiting). Tokenizing happens here: call it off the
        event loop."""
        for choice, request in enumerate(self.item.requests):
            request = dataclasses.replace(request, id=self.request_ids[choice])
            self.num_dispatched += 1
            before_each()
            on_piece = (lambda piece, choice=choice: self._hand_over(PieceEvent(choice, piece, time.perf_counter()))) \
                if self.streams else None
            self._handles.append(self.runner.submit(
                request, on_piece=on_piece, on_finish=lambda result, choice=choice: self._hand_over(ResultEvent(choice, result))))

    def _hand_over(self, event: PieceEvent | ResultEvent) -> None:
        """On the runner's thread: pass the event on to the loop, with the rest of its step."""
        self._dispatcher.put(self, event)

    def receive(self, event: PieceEvent | ResultEvent) -> None:
        """On the loop: queue the event, unless it is a piece of a choice this job cancelled
        (the engine applies a cancel at its next step; what it made meanwhile is not wanted)
        or a piece the queue has no room for (the request is then cancelled). Results always
        come through, and always fit: they say how each choice ended, and end the stream."""
        if isinstance(event, PieceEvent):
            if event.choice in self._cancelled:
                return
            if self.events.qsize() >= MAX_QUEUED_EVENTS:
                if not self.is_overrun:
                    self.is_overrun = True
                    logger.warning("request %s: its client fell %d pieces behind; cancelled", self.body_id,
                                   MAX_QUEUED_EVENTS)
                    self.cancel()
                return
        self.events.put_nowait(event)

    def rejection(self) -> Result | None:
        """The result of a choice the runner refused outright (a prompt that cannot fit, say):
        the whole request is then a client error, and its other choices are cancelled."""
        refused = next((handle.result() for handle in self._handles
                        if handle.done and handle.result().is_invalid_request), None)
        if refused is not None:
            self.cancel()
        return refused

    def cancel(self) -> None:
        """Cancel every choice that has not ended (the client went away, or gave up), without
        waiting for the engine: safe on the event loop."""
        for choice, request_id in enumerate(self.request_ids):
            if choice < len(self._handles) and choice not in self.results and not self._handles[choice].done:
                self._cancelled.add(choice)
                self.runner.cancel_soon(request_id)

    @property
    def is_complete(self) -> bool:
        return len(self.results) == self.item.n

    async def events_until_complete(self) -> AsyncIterator[PieceEvent | ResultEvent]:
        """The events in order. Pieces of one choice that queued up while the consumer was busy
        (a client reading slower than the engine writes) come joined as one: one chunk to build
        and send where there were many, and the same text. A consumer that keeps up gets every
        piece as it was made."""
        held: PieceEvent | ResultEvent | None = None
        while not self.is_complete:
            event, held = (held, None) if held is not None else (await self.events.get(), None)
            if isinstance(event, PieceEvent) and not self.events.empty():
                run = [event]
                while not self.events.empty():
                    following = self.events.get_nowait()
                    if not (isinstance(following, PieceEvent) and following.choice == event.choice):
                        held = following
                        break
                    run.append(following)
                event = _joined(run)
            if isinstance(event, ResultEvent):
                self.results[event.choice] = event.result
            yield event

    async def all_results(self) -> list[Result]:
        async for _ in self.events_until_complete():
            pass
        return [self.results[choice] for choice in range(self.item.n)]


def _joined(run: list[PieceEvent]) -> PieceEvent:
    """Consecutive pieces of one choice as one, made when the first was (its time to first token)."""
    if len(run) == 1:
        return run[0]
    first = run[0]
    pieces = [event.piece for event in run]
    # The last piece's reading reads the run's text at once (what the earlier ones parse into
    # comes with it: none of them was asked).
    last = pieces[-1]
    piece = TextPiece(first.piece.request_id, "".join(piece.text for piece in pieces),
                      tuple(logprob for piece in pieces for logprob in piece.logprobs), last.output, last.num_parts,
                      last.is_last, first.piece.prompt_first_token, first.piece.prompt_logprobs)
    return PieceEvent(first.choice, piece, first.at)


def failure_of(results: list[Result]) -> Result | None:
    """The first choice that did not end by stop or length."""
    return next((result for result in results if not result.ok), None)
