"""Request bodies as JSON objects, read with a size limit and refused in OpenAI's error shape."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request as HttpRequest

from .errors import ApiError


async def read_json(request: HttpRequest, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past `limit` bytes (checked as it arrives, never held
    whole beyond the limit), 400 when it is not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    data, size = bytearray(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        data += chunk
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"The request body is not valid JSON ({_json_error(error)}).") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def _json_error(error: Exception) -> str:
    return error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply or malformed"


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than this server's limit of {limit} bytes.",
                    code="request_too_large")
