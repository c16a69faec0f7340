"""Errors on the Messages API's routes in Anthropic's shape, {"type": "error", "error": {"type",
"message"}}, with the status the Chat Completions path would give; and Anthropic's events, named
by their type.

Part of Anthropic's Messages API, translated at the door onto the Chat Completions path
(multiseq.server.messages).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from .errors import ApiError
from .sse import sse

# Anthropic's error types, by the HTTP status they come with (its "Errors" page).
ERROR_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# A failure reported inside a stream has no status: its OpenAI type says what it was.
ERROR_TYPES_BY_OPENAI_TYPE = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "not_found_error": "not_found_error",
    "overloaded_error": "overloaded_error",
}
API_ERROR = "api_error"


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    """The seam's ApiError (OpenAI's shape) as Anthropic's error, same status and headers."""
    error_type = ERROR_TYPES_BY_STATUS.get(error.status, API_ERROR if error.status >= 500 else "invalid_request_error")
    message = error.message
    if error.prompt_too_long is not None:  # Anthropic's words, which Claude Code acts on (it compacts)
        too_long = error.prompt_too_long
        message = f"prompt is too long: {too_long.num_prompt} tokens > {too_long.max_prompt} maximum; {message}"
    return JSONResponse(error_body(error_type, message), status_code=error.status, headers=error.headers)


def stream_error_event(openai_error: dict[str, Any]) -> str:
    """An `error` event for a failure the chat layer reported mid-stream ({"error": {...}})."""
    details = openai_error.get("error") or {}
    error_type = ERROR_TYPES_BY_OPENAI_TYPE.get(details.get("type"), API_ERROR)
    return sse_event("error", error_body(error_type, details.get("message") or "The generation failed."))


def sse_event(event_type: str, data: dict[str, Any]) -> str:
    """An Anthropic event: named by its type, which its data repeats."""
    return sse(data, event=event_type)
