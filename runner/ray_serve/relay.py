"""A replica's answer on its way through multiseq.ray_serve's gateway: relayed to the client
with the replica named in a header (`Relay`), or gathered whole (`Collector`); and ended in the
API's own shape when the replica dies halfway.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from multiseq.ray_serve.calls import ACCEPTED
from multiseq.server.errors import SERVER_ERROR, error_body
from multiseq.server.messages_errors import stream_error_event
from multiseq.server.sse import sse

REPLICA_HEADER = b"x-multiseq-replica"
REPLICA_LOST = ("The replica serving this request stopped before it finished (Ray Serve restarts it); "
                "send the request again.")
_SEQUENCE_NUMBER = re.compile(rb'"sequence_number":\s*(\d+)')
_RESPONSE_ID = re.compile(rb'"id":\s*"(resp_[A-Za-z0-9_-]+)"')


def error_response(path: str, status: int, message: str, code: str) -> JSONResponse:
    """An error in the shape of the API at `path` (Anthropic's for /v1/messages)."""
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": "api_error" if status >= 500 else "invalid_request_error",
                                           "message": message}}
    else:
        body = error_body(message, SERVER_ERROR if status >= 500 else "invalid_request_error", code=code)
    return JSONResponse(body, status_code=status)


class Relay:
    """A replica's answer on its way to the client: the replica named in a header, and what a
    stream needs to be ended properly if the replica dies halfway (the API's error event)."""

    def __init__(self, send: Callable, path: str, on_response_id: Callable[[str, str], None] | None = None) -> None:
        self._send = send
        self._path = path
        # Told (response id, replica) as soon as a Responses answer's id is seen, before it goes
        # out: a client continuing it at once must find its home known.
        self._on_response_id = on_response_id
        self.replica: str | None = None
        self.is_started = False
        self.is_complete = False
        self._is_event_stream = False
        self._last_sequence_number = -1
        self.response_id: str | None = None

    async def forward(self, batch: list[dict[str, Any]]) -> None:
        for message in batch:
            if message["type"] == ACCEPTED:
                self.replica = message["replica"]
                continue
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                self._is_event_stream = any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                                            for name, value in headers)
                message = {**message, "headers": [*headers, (REPLICA_HEADER, (self.replica or "").encode())]}
                self.is_started = True
            elif message["type"] == "http.response.body":
                self._note(message.get("body", b""))
                self.is_complete = not message.get("more_body", False)
            await self._send(message)

    def _note(self, body: bytes) -> None:
        if self._path == "/v1/responses":
            if self.response_id is None and (found := _RESPONSE_ID.search(body)):
                self.response_id = found.group(1).decode()
                if self._on_response_id is not None and self.replica is not None:
                    self._on_response_id(self.response_id, self.replica)
            numbers = _SEQUENCE_NUMBER.findall(body)
            if numbers:
                self._last_sequence_number = int(numbers[-1])

    async def fail(self) -> None:
        """The replica died: a 502, or (once the status went out) the stream's error event."""
        if not self.is_started:
            response = error_response(self._path, 502, REPLICA_LOST, "replica_lost")
            await response({"type": "http"}, _no_receive, self._send)
        else:
            tail = self._error_event() if self._is_event_stream else ""
            await self._send({"type": "http.response.body", "body": tail.encode(), "more_body": False})
        self.is_complete = True

    def _error_event(self) -> str:
        if self._path.startswith("/v1/messages"):
            return stream_error_event(error_body(REPLICA_LOST, SERVER_ERROR, code="replica_lost"))
        if self._path == "/v1/responses":
            return sse({"type": "error", "code": "replica_lost", "message": REPLICA_LOST, "param": None,
                        "sequence_number": self._last_sequence_number + 1}, "error")
        return sse(error_body(REPLICA_LOST, SERVER_ERROR, code="replica_lost")) + sse("[DONE]")


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


@dataclass(frozen=True)
class Answer:
    """A replica's whole answer to one call (what Collector gathers)."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json_status(self) -> str:
        """The `status` of a /health answer ("ok", "loading", "shutting down", ...)."""
        try:
            return str(json.loads(self.body).get("status", self.status))
        except (ValueError, AttributeError):
            return str(self.status)


class Collector:
    """A whole answer, gathered."""

    def __init__(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()

    def take(self, batch: list[dict[str, Any]]) -> None:
        for message in batch:
            if message["type"] == "http.response.start":
                self._status = message["status"]
                self._headers = {name.decode("latin-1"): value.decode("latin-1")
                                 for name, value in message.get("headers", []) if name.lower() != b"content-length"}
            elif message["type"] == "http.response.body":
                self._body += message.get("body", b"")

    def answer(self) -> Answer:
        return Answer(self._status, self._headers, bytes(self._body))
