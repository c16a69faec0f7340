"""Server-sent events: the response that streams them, and the watch for a client going away."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from .errors import internal_error

logger = logging.getLogger("multiseq.server")


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
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                await wait_for_disconnect(receive)
                self._on_disconnect()
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"), *self._headers]})
                async for event in self._events:
                    await send({"type": "http.response.body", "body": event.encode("utf-8"), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:  # the connection broke while writing
                self._on_disconnect()
            except Exception:  # noqa: BLE001 - the status is sent; tell the client in the stream, log the rest
                logger.exception("a streamed response failed")
                self._on_disconnect()
                await _send_quietly(send, self._error_event())
            finally:
                group.cancel_scope.cancel()


async def _send_quietly(send: Send, text: str) -> None:
    try:
        await send({"type": "http.response.body", "body": text.encode("utf-8"), "more_body": False})
    except OSError:
        pass
