"""One HTTP request in the engine: its choices as runner requests, bridged to the event loop.

The runner's worker thread hands each text piece and each result to the request's own asyncio
queue with loop.call_soon_threadsafe: no thread and no polling per request. The handler (or the
stream it returns) awaits that queue; when the client goes away, the job cancels whatever of it
is still waiting or running, and the runner frees the slot at its next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..formats.reader import PromptItem
from ..runner import Result, Runner, TextPiece

logger = logging.getLogger("multiseq.server")

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


class Job:
    """The runner requests of one HTTP request (one per choice) and the events they produce."""

    def __init__(self, runner: Runner, item: PromptItem, loop: asyncio.AbstractEventLoop, body_id: str) -> None:
        self.runner = runner
        self.item = item
        self.body_id = body_id
        # Bounded: MAX_QUEUED_EVENTS pieces, and room for every choice's result beyond them.
        self.events: asyncio.Queue[PieceEvent | ResultEvent] = asyncio.Queue(MAX_QUEUED_EVENTS + item.n)
        self.is_overrun = False  # its client fell MAX_QUEUED_EVENTS pieces behind: cancelled
        self.request_ids = [f"{body_id}-{index}" for index in range(item.n)]
        self.results: dict[int, Result] = {}
        self.arrived_at = time.perf_counter()
        self._loop = loop
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
            self._handles.append(self.runner.submit(
                request, on_piece=lambda piece, choice=choice: self._hand_over(PieceEvent(choice, piece, time.perf_counter())),
                on_finish=lambda result, choice=choice: self._hand_over(ResultEvent(choice, result))))

    def _hand_over(self, event: PieceEvent | ResultEvent) -> None:
        """On the runner's thread: pass the event to the event loop (a closed loop, at
        shutdown, has no one left to tell)."""
        try:
            self._loop.call_soon_threadsafe(self._queue_event, event)
        except RuntimeError:
            pass

    def _queue_event(self, event: PieceEvent | ResultEvent) -> None:
        """On the event loop: queue the event, unless it is a piece the queue has no room for
        (the request is then cancelled; its result, which ends the stream, always fits)."""
        if isinstance(event, PieceEvent) and self.events.qsize() >= MAX_QUEUED_EVENTS:
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
        """Cancel every choice that has not ended (the client went away, or gave up)."""
        for choice, request_id in enumerate(self.request_ids):
            if choice not in self.results and not self._handles[choice].done:
                self.runner.cancel(request_id)

    @property
    def is_complete(self) -> bool:
        return len(self.results) == self.item.n

    async def events_until_complete(self) -> AsyncIterator[PieceEvent | ResultEvent]:
        while not self.is_complete:
            event = await self.events.get()
            if isinstance(event, ResultEvent):
                self.results[event.choice] = event.result
            yield event

    async def all_results(self) -> list[Result]:
        async for _ in self.events_until_complete():
            pass
        return [self.results[choice] for choice in range(self.item.n)]


def failure_of(results: list[Result]) -> Result | None:
    """The first choice that did not end by stop or length."""
    return next((result for result in results if not result.ok), None)
