"""OpenAI's Responses API as a translation onto the Chat Completions path: its routes, and
the responses stored and being generated.

A Responses request (`input` items, `instructions`, flat function tools, `text.format`, ...)
becomes one Chat Completions body (multiseq.server.responses_request: `parse_request`, then
`chat_body`; the input items in responses_input); the chat.completion the engine gives back
becomes a Response object (responses_output: `response_from_completion`), and a stream's deltas
(the engine's: text, reasoning, calls) become the Responses API's server-sent events
(responses_events: `EventTranslator`).
Tools the server cannot run (web search, file search, image generation, ...) are left out of
the prompt and named in the `x-multiseq-ignored-tools` header, never refused: Codex CLI sends
them with every request and gives up when they are refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .bodies import read_json
from .chat import CompletionCall, start_chat
from .errors import NOT_FOUND, ApiError, internal_error
from .offload import Offload
from .response_store import (
    MissingResponse,
    ResponseStore,
    StoredResponse,
    open_response_store,
)
from .responses_events import EventTranslator
from .responses_input import new_id
from .responses_output import Outcome, response_from_completion
from .responses_request import ResponsesRequest, chat_body, chat_param, parse_request
from .sse import EventStream, sse
from .store import StoreError

logger = logging.getLogger("multiseq.server")


IGNORED_TOOLS_HEADER = "x-multiseq-ignored-tools"
CANCEL_WAIT_SECONDS = 10  # how long a cancel waits for the stream it stops to end
INPUT_ITEMS_LIMIT = (20, 100)  # (default, largest) items a page of input_items holds: OpenAI's


@dataclass
class _InFlight:
    """A streamed response being generated (its id went out in its first event): what
    POST /v1/responses/{id}/cancel stops."""

    call: CompletionCall
    translator: EventTranslator
    is_cancelled: bool = False
    final: dict[str, Any] | None = None  # the Response object it ended as
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ResponsesService:
    """The app's stored responses and those being generated."""

    def __init__(self, store: ResponseStore, offload: Offload) -> None:
        self.store = store
        self.offload = offload  # the store is read and written in the io threads
        self.in_flight: dict[str, _InFlight] = {}


async def service_of(request: HttpRequest) -> ResponsesService:
    """The app's service, made at its first use: the data directory's database when the server
    has one (opened off the event loop), else an in-memory store."""
    service = getattr(request.app.state, "responses", None)
    if service is None:
        offload = request.app.state.server.offload
        try:
            store = await offload.io(open_response_store, request.app.state.server.settings.data_dir)
        except StoreError as error:
            logger.error("%s", error)
            raise internal_error() from None
        service = getattr(request.app.state, "responses", None) or ResponsesService(store, offload)
        request.app.state.responses = service
    return service


async def create_response(request: HttpRequest) -> Response:
    """POST /v1/responses: the request runs as a chat completion; the answer is a Response
    object, or its events when streamed. A stored one is kept before the last event goes out,
    so a client may continue it at once."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    parsed = parse_request(body)
    service = await service_of(request)
    history = await _history(service, parsed.previous_response_id)
    chat = chat_body(parsed, history) | ({"stream": True} if parsed.is_stream else {})
    call = await _renamed_errors(start_chat(request, chat, "responses"))
    response_id, created_at, model = new_id("resp"), int(time.time()), call.model
    headers = {IGNORED_TOOLS_HEADER: ", ".join(parsed.ignored_tools)} if parsed.ignored_tools else None
    if parsed.is_stream:
        translator = EventTranslator(parsed, response_id, created_at, model)
        events = _stream_events(service, parsed, response_id, _InFlight(call, translator))
        return EventStream(events, on_disconnect=call.cancel, headers=headers,
                           error_event=lambda: sse(translator.error_event(), "error"))
    # Not streamed, the client learns the id only at the end: there is nothing it could cancel.
    completion = await _renamed_errors(call.completion(request))
    if completion is None:
        return Response(status_code=499)  # the client went away: its job is cancelled, no one to answer
    response = response_from_completion(parsed, completion, response_id, created_at, model)
    await _keep(service, parsed, response)
    return JSONResponse(response, headers=headers)


async def _history(service: ResponsesService, previous_response_id: str | None) -> list[dict[str, Any]]:
    if previous_response_id is None:
        return []
    try:
        return await service.offload.io(service.store.conversation, previous_response_id)
    except MissingResponse as missing:
        which = ("is not stored" if missing.response_id == previous_response_id
                 else f"continues {missing.response_id}, which is not stored")
        raise ApiError(404, f"The previous response {previous_response_id} {which} (deleted, created with "
                            f"store false, or forgotten by a server without a data directory).", NOT_FOUND,
                       "previous_response_id", "previous_response_not_found") from None


async def _renamed_errors(awaitable: Any) -> Any:
    """Await a chat call, its errors naming the Responses fields instead of the chat ones."""
    try:
        return await awaitable
    except ApiError as error:
        raise ApiError(error.status, error.message, error.kind, chat_param(error.param), error.code,
                       error.headers) from None


async def _keep(service: ResponsesService, parsed: ResponsesRequest, response: dict[str, Any]) -> None:
    if parsed.is_stored:
        record = StoredResponse(response["id"], response["created_at"], parsed.previous_response_id,
                                parsed.input_items, response)
        await service.offload.io(service.store.put, record)


async def _stream_events(service: ResponsesService, parsed: ResponsesRequest, response_id: str,
                         flight: _InFlight) -> AsyncIterator[str]:
    translator = flight.translator
    service.in_flight[response_id] = flight
    try:
        for event in translator.start():
            yield sse(event, event["type"])
        async for part in flight.call.events():
            for event in translator.feed(part):
                yield sse(event, event["type"])
        if flight.is_cancelled:
            translator.cancel()
        last_events = translator.finish()
        await _keep(service, parsed, translator.response)
        flight.final = translator.response
        for event in last_events:
            yield sse(event, event["type"])
    finally:
        service.in_flight.pop(response_id, None)
        flight.done.set()


async def get_response(request: HttpRequest) -> Response:
    return JSONResponse((await _stored(request)).response)


async def delete_response(request: HttpRequest) -> Response:
    service = await service_of(request)
    response_id = request.path_params["response_id"]
    if not await service.offload.io(service.store.delete, response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def cancel_response(request: HttpRequest) -> Response:
    """Stop a response being generated (it ends with status "cancelled"); a finished one is
    returned as it is."""
    service = await service_of(request)
    flight = service.in_flight.get(request.path_params["response_id"])
    if flight is None:
        return JSONResponse((await _stored(request)).response)
    flight.is_cancelled = True
    flight.call.cancel()
    try:  # the stream ends at the engine's next step, unless its client stopped reading
        await asyncio.wait_for(flight.done.wait(), CANCEL_WAIT_SECONDS)
    except TimeoutError:
        pass
    return JSONResponse(flight.final or flight.translator.snapshot(Outcome("cancelled")))


async def list_input_items(request: HttpRequest) -> Response:
    """GET /v1/responses/{id}/input_items: the response's own input items, paged like OpenAI's
    (`order` desc by default, `after` an item id, `limit` 1 to 100)."""
    record = await _stored(request)
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"'order' must be \"asc\" or \"desc\", got {json.dumps(order)}.", param="order")
    limit = query.get("limit", str(INPUT_ITEMS_LIMIT[0]))
    if not limit.isdigit() or not 1 <= int(limit) <= INPUT_ITEMS_LIMIT[1]:
        raise ApiError(400, f"'limit' must be a whole number from 1 to {INPUT_ITEMS_LIMIT[1]}, got "
                            f"{json.dumps(limit)}.", param="limit")
    items = record.input_items if order == "asc" else record.input_items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise ApiError(404, f"The response {record.id} has no input item {json.dumps(after)}.", NOT_FOUND,
                           "after", "item_not_found")
        items = items[ids.index(after) + 1:]
    page = items[:int(limit)]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)})


async def _stored(request: HttpRequest) -> StoredResponse:
    service = await service_of(request)
    response_id = request.path_params["response_id"]
    record = await service.offload.io(service.store.get, response_id)
    if record is None:
        raise _not_found(response_id)
    return record


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response {json.dumps(response_id)} is stored.", NOT_FOUND, "response_id",
                    "response_not_found")


ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/responses", create_response, methods=["POST"]),  # llama-server's alias
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
]
