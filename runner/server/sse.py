"""Server-sent events: the response that streams them, and the watch for a client going away
(or stalling: a client that reads nothing for the send timeout is cut, its request cancelled)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from .errors import internal_error
from .state import DEFAULT_KEEP_ALIVE_SECONDS, DEFAULT_SEND_TIMEOUT_SECONDS

logger = logging.getLogger("multiseq.server")

# An SSE comment: clients ignore it, proxies see traffic and keep an idle stream open.
KEEP_ALIVE = ": keep-alive\n\n"


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One server-sent event: `data: <json>` (or a literal such as [DONE]), named when `event`
    is given (the Responses and Messages APIs name each event)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"event: {event}\ndata: {text}\n\n" if event else f"data: {text}\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream:
    """A text/event-stream response that watches for the client going away the whole time (a
    request still queued sends nothing, so a failed write would never tell): then it cancels
    the job at once, which frees its slot at the runner's next step. `headers` are sent with
    the status (say, the tools a request left out)."""

    def __init__(self, events: AsyncIterator[str], on_disconnect: Callable[[], None],
                 headers: dict[str, str] | None = None, error_event: Callable[[], str] | None = None) -> None:
        self._events = events
        self._on_disconnect = on_disconnect
        self._headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                         for name, value in (headers or {}).items()]
        # What to send when the stream fails after its status went out (the API's error event).
        self._error_event = error_event or (lambda: sse(internal_error().body()) + sse("[DONE]"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        send_timeout, keep_alive = _stream_timings(scope)

        async def send_in_time(message: dict[str, Any]) -> None:  # a client that stopped reading blocks send
            with anyio.fail_after(send_timeout):
                await send(message)

        async with anyio.create_task_group() as group:
            async def watch() -> None:
                await wait_for_disconnect(receive)
                self._on_disconnect()
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await send_in_time({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"), *self._headers]})
                async with aclosing(with_keep_alives(self._events, keep_alive)) as events:
                    async for event in events:
                        await send_in_time({"type": "http.response.body", "body": event.encode("utf-8"),
                                            "more_body": True})
                await send_in_time({"type": "http.response.body", "body": b"", "more_body": False})
            except TimeoutError:  # (an OSError too) the client stopped reading but kept the connection
                logger.warning("a client read nothing of its stream for %g s: its request is cancelled", send_timeout)
                self._on_disconnect()
            except OSError:  # the connection broke while writing
                self._on_disconnect()
            except Exception:  # noqa: BLE001 - the status is sent; tell the client in the stream, log the rest
                logger.exception("a streamed response failed")
                self._on_disconnect()
                with anyio.move_on_after(send_timeout):
                    await _send_quietly(send, self._error_event())
            finally:
                group.cancel_scope.cancel()


def _stream_timings(scope: Scope) -> tuple[float, float]:
    """The send timeout and keep-alive interval of the app serving this stream (its settings)."""
    state = getattr(getattr(scope.get("app"), "state", None), "server", None)
    if state is None:  # mounted outside this server's app: the defaults
        return DEFAULT_SEND_TIMEOUT_SECONDS, DEFAULT_KEEP_ALIVE_SECONDS
    return state.settings.send_timeout_s, state.settings.keep_alive_s


async def with_keep_alives(events: AsyncIterator[str], interval: float) -> AsyncIterator[str]:
    """The events, and KEEP_ALIVE whenever none came for `interval` seconds (a request waiting
    for a slot sends nothing). The next event is awaited in a task of its own, so a keep-alive
    never interrupts the stream's generator."""
    iterator = aiter(events)
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEP_ALIVE
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:  # the stream was cut: stop the generator where it waits
            pending.cancel()


async def _send_quietly(send: Send, text: str) -> None:
    try:
        await send({"type": "http.response.body", "body": text.encode("utf-8"), "more_body": False})
    except OSError:
        pass
