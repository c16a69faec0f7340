"""Anthropic's Messages API, translated at the door onto the Chat Completions path: its routes.

`POST /v1/messages` (Claude Code adds `?beta=true`) and `POST /v1/messages/count_tokens`. A
Messages body becomes a Chat Completions body (messages_request: `translate_request`), the
chat.completion that comes back becomes a Message (messages_output: `message_of`), and a
stream's deltas (the engine's: text, reasoning, calls) become Anthropic's server-sent events
(messages_stream: `message_events`). One engine, one request shape, one sessions cache: nothing here knows about
the model, the template or tool-call formats.

Errors on these routes are Anthropic's shape (messages_errors), {"type": "error", "error":
{"type", "message"}}, with the status the Chat Completions path would give; a 400 names the
field in its message (`messages[1].content[0].tool_use_id: ...`), since Anthropic's errors carry
no `param`.
"""

from __future__ import annotations


from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from .bodies import read_json
from .chat import count_prompt_tokens, start_chat
from .errors import in_error_shape, internal_error
from .messages_errors import ERROR_TYPES_BY_STATUS  # noqa: F401 - the door reads it here
from .messages_errors import API_ERROR, error_body, error_response, sse_event
from .messages_output import message_id, message_of
from .messages_request import translate_request
from .messages_stream import message_events
from .sse import EventStream


ENDPOINT = "/v1/messages"
IGNORED_TOOLS_HEADER = "x-multiseq-ignored-tools"


# Errors of a Messages route in Anthropic's shape.
_in_anthropic_shape = in_error_shape(error_response)


@_in_anthropic_shape
async def create_message(request: HttpRequest) -> Response:
    """POST /v1/messages: a Message, or with "stream": true its events."""
    state = request.app.state.server
    translated = translate_request(await read_json(request, state.settings.max_body_bytes))
    headers = _ignored_tools_header(translated.ignored_tools)
    call = await start_chat(request, translated.chat_body, api="messages")
    identity = message_id(call.body_id)
    if translated.is_stream:
        return EventStream(message_events(call.events(), translated, identity), on_disconnect=call.cancel,
                           headers=headers, error_event=_internal_error_event)
    completion = await call.completion(request)
    if completion is None:  # the client went away: its request was cancelled, no one to answer
        return Response(status_code=499)
    return JSONResponse(message_of(completion, translated), headers=headers)


@_in_anthropic_shape
async def count_tokens(request: HttpRequest) -> Response:
    """POST /v1/messages/count_tokens: the prompt's tokens, as the model's template renders it."""
    state = request.app.state.server
    translated = translate_request(await read_json(request, state.settings.max_body_bytes), for_counting=True)
    return JSONResponse({"input_tokens": await count_prompt_tokens(request, translated.chat_body)})


def _ignored_tools_header(names: tuple[str, ...]) -> dict[str, str]:
    """The server tools left out, as a header (ASCII: a header cannot carry any name a client sends)."""
    if not names:
        return {}
    return {IGNORED_TOOLS_HEADER: ", ".join(names).encode("ascii", "replace").decode("ascii")}


def _internal_error_event() -> str:
    return sse_event("error", error_body(API_ERROR, internal_error().message))
