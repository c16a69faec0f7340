"""Errors as OpenAI's API gives them: {"error": {"message", "type", "param", "code"}}, with the
HTTP status that goes with each. Nothing internal (a traceback, a path, an exception's repr)
ever goes into a message: a failure the client did not cause is a 500 with a fixed text, and
its details go to the server's log."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
OVERLOADED = "overloaded_error"
INTERNAL_ERROR_MESSAGE = "The server had an error while processing your request; its log has the details."


@dataclass(frozen=True)
class PromptTooLong:
    """Why a prompt was refused, in numbers: clients shrink the conversation by them (Claude
    Code compacts it when told "prompt is too long: N tokens > M maximum")."""

    num_prompt: int
    max_prompt: int  # the longest prompt a slot takes (its window less one token to generate)


class ApiError(Exception):
    """A request that ends in an error response."""

    def __init__(self, status: int, message: str, kind: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 prompt_too_long: PromptTooLong | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = headers
        self.prompt_too_long = prompt_too_long

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def internal_error() -> ApiError:
    return ApiError(500, INTERNAL_ERROR_MESSAGE, SERVER_ERROR)


Route = Callable[[HttpRequest], Awaitable[Response]]


def in_error_shape(response_of: Callable[[ApiError], Response]) -> Callable[[Route], Route]:
    """A decorator answering a route's errors in another API's shape (`response_of` makes it
    from the ApiError): the seam's ApiErrors converted, anything unexpected logged and answered
    with the fixed internal error."""
    def decorate(route: Route) -> Route:
        async def answer(request: HttpRequest) -> Response:
            try:
                return await route(request)
            except ApiError as error:
                return response_of(error)
            except Exception:
                logging.getLogger("multiseq.server").exception("unexpected error on %s %s", request.method,
                                                               request.url.path)
                return response_of(internal_error())
        return answer
    return decorate
