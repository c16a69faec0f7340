"""Request bodies as JSON objects: declared as JSON, read with a size limit, every number finite,
and refused in OpenAI's error shape otherwise."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request as HttpRequest

from ..formats.fields import non_finite_path
from .errors import ApiError

JSON_MEDIA_TYPE = "application/json"
JSON_SUFFIX = "+json"  # application/merge-patch+json and the like are JSON too


async def read_json(request: HttpRequest, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 415 unless its Content-Type is JSON (a page in a browser may
    POST text/plain to any site without asking: only JSON keeps it out), 413 past `limit` bytes
    (checked as it arrives, never held whole beyond the limit), 400 when it is not JSON or holds
    NaN or an infinity."""
    require_json_content_type(request)
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
    where = non_finite_path(body)
    if where is not None:
        raise ApiError(400, f"'{where}' is not a finite number: NaN and Infinity are not JSON numbers.", param=where)
    return body


def require_json_content_type(request: HttpRequest) -> None:
    """415 unless the Content-Type is application/json or a +json type (parameters such as
    `charset` are fine)."""
    declared = request.headers.get("content-type", "")
    media_type = declared.partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE and not (media_type.startswith("application/") and media_type.endswith(JSON_SUFFIX)):
        shown = f"'{declared}'" if declared else "none"
        raise ApiError(415, f"The request body must be JSON sent with 'Content-Type: application/json' (got {shown}).",
                       code="unsupported_media_type")


def _json_error(error: Exception) -> str:
    return error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply or malformed"


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than this server's limit of {limit} bytes.",
                    code="request_too_large")
