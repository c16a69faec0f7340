"""Server-sent events (and Ollama's JSON lines): the response that streams them, and the watch for
a client going away (or stalling: a client that reads nothing for the send timeout is cut, its
request cancelled)."""

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
                 headers: dict[str, str] | None = None, error_event: Callable[[], str] | None = None,
                 media_type: str = "text/event-stream; charset=utf-8", keep_alive: str | None = KEEP_ALIVE) -> None:
        self._events = events
        self._on_disconnect = on_disconnect
        self._headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                         for name, value in (headers or {}).items()]
        # What to send when the stream fails after its status went out (the API's error event).
        self._error_event = error_event or (lambda: sse(internal_error().body()) + sse("[DONE]"))
        # A stream of JSON lines (Ollama's) has no comment to keep a connection busy: keep_alive None.
        self._media_type = media_type.encode("latin-1")
        self._keep_alive = keep_alive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        send_timeout, keep_alive = _stream_timings(scope)
        sender = _WatchedSender(send, send_timeout, keep_alive, self._keep_alive)
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                await wait_for_disconnect(receive)
                self._on_disconnect()
                group.cancel_scope.cancel()

            async def watch_sends() -> None:
                await sender.watch()  # returns when a send stalled past the timeout
                logger.warning("a client read nothing of its stream for %g s: its request is cancelled", send_timeout)
                self._on_disconnect()
                group.cancel_scope.cancel()

            group.start_soon(watch)
            group.start_soon(watch_sends)
            try:
                await sender.send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", self._media_type), (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"), *self._headers]})
                async with aclosing(self._events) as events:
                    async for event in events:
                        await sender.send({"type": "http.response.body", "body": event.encode("utf-8"),
                                           "more_body": True})
                await sender.send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:  # the connection broke while writing
                self._on_disconnect()
            except Exception:  # noqa: BLE001 - the status is sent; tell the client in the stream, log the rest
                logger.exception("a streamed response failed")
                self._on_disconnect()
                with anyio.move_on_after(send_timeout):
                    await _send_quietly(send, self._error_event())
            finally:
                group.cancel_scope.cancel()


class _WatchedSender:
    """A stream's sends, watched by one timer rather than a timeout around each send (which cost
    a cancel scope per token): a send that stays blocked past the send timeout (the client
    stopped reading but kept the connection) ends the watch; a stream that sent nothing for the
    keep-alive interval (its request waits for a slot) gets KEEP_ALIVE between its events."""

    def __init__(self, send: Send, send_timeout: float, keep_alive: float, keep_alive_text: str | None) -> None:
        self._send = send
        self._send_timeout = send_timeout
        self._keep_alive = keep_alive
        self._keep_alive_text = keep_alive_text  # None: nothing is sent while a stream waits
        self._lock = asyncio.Lock()  # one send at a time: a keep-alive never splits an event
        self._sending_since: float | None = None
        self._last_sent = asyncio.get_running_loop().time()

    async def send(self, message: dict[str, Any]) -> None:
        async with self._lock:
            loop = asyncio.get_running_loop()
            self._sending_since = loop.time()
            try:
                await self._send(message)
            finally:
                self._sending_since = None
                self._last_sent = loop.time()

    async def watch(self) -> None:
        """Wake at a fraction of the shorter interval; return once a send is stalled. (It first
        runs once the stream's first send, its status, has begun: keep-alives follow a status.)"""
        loop = asyncio.get_running_loop()
        tick = min(self._send_timeout, self._keep_alive) / 4
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            if self._sending_since is not None:
                if now - self._sending_since > self._send_timeout:
                    return
            elif self._keep_alive_text and now - self._last_sent >= self._keep_alive and not self._lock.locked():
                with anyio.move_on_after(self._send_timeout) as scope:
                    await self.send({"type": "http.response.body", "body": self._keep_alive_text.encode("utf-8"),
                                     "more_body": True})
                if scope.cancelled_caught:
                    return


def _stream_timings(scope: Scope) -> tuple[float, float]:
    """The send timeout and keep-alive interval of the app serving this stream (its settings)."""
    state = getattr(getattr(scope.get("app"), "state", None), "server", None)
    if state is None:  # mounted outside this server's app: the defaults
        return DEFAULT_SEND_TIMEOUT_SECONDS, DEFAULT_KEEP_ALIVE_SECONDS
    return state.settings.send_timeout_s, state.settings.keep_alive_s


async def _send_quietly(send: Send, text: str) -> None:
    try:
        await send({"type": "http.response.body", "body": text.encode("utf-8"), "more_body": False})
    except OSError:
        pass
