"""The routes of the Files and Batch APIs, in OpenAI's shapes: uploads and downloads, batches
created, listed, polled and cancelled. The work behind them is batches.py's."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from .batches import BATCH_PURPOSE, COMPLETION_WINDOW, ENDPOINTS, BatchService
from .bodies import read_json
from .errors import NOT_FOUND, ApiError
from .store import BatchRecord, FileRecord, Page
from .uploads import receive_upload

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
BATCH_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata"}
FILE_LIST_LIMIT, BATCH_LIST_LIMIT = (10_000, 10_000), (20, 100)  # (default, largest): OpenAI's


def service_of(request: HttpRequest) -> BatchService:
    """The app's batch service, running once the model is there; 404 when the server keeps no
    data directory (an app made without one)."""
    state = request.app.state.server
    if state.batches is None:
        raise ApiError(404, "The Files and Batch APIs need a data directory, which this server was not given.",
                       NOT_FOUND, code="unknown_url")
    state.start_batches()
    return state.batches


# --- shapes -------------------------------------------------------------------------------------

def file_object(record: FileRecord) -> dict[str, Any]:
    return {"id": record.id, "object": "file", "bytes": record.bytes, "created_at": record.created_at,
            "filename": record.filename, "purpose": record.purpose, "status": "processed", "status_details": None,
            "expires_at": None}


def batch_object(record: BatchRecord) -> dict[str, Any]:
    return {
        "id": record.id, "object": "batch", "endpoint": record.endpoint, "model": record.model,
        "errors": {"object": "list", "data": record.errors} if record.errors else None,
        "input_file_id": record.input_file_id, "completion_window": record.completion_window,
        "status": record.status, "output_file_id": record.output_file_id, "error_file_id": record.error_file_id,
        "created_at": record.created_at, "in_progress_at": record.in_progress_at, "expires_at": record.expires_at,
        "finalizing_at": record.finalizing_at, "completed_at": record.completed_at, "failed_at": record.failed_at,
        "expired_at": None, "cancelling_at": record.cancelling_at, "cancelled_at": record.cancelled_at,
        "request_counts": {"total": record.total, "completed": record.completed, "failed": record.failed},
        "metadata": record.metadata,
    }


def list_object(page: Page, shape) -> dict[str, Any]:
    data = [shape(record) for record in page.records]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}


async def _io(request: HttpRequest, function, *args):
    """File and database work, in the server's io pool (never behind requests being prepared)."""
    return await request.app.state.server.offload.io(function, *args)


# --- files --------------------------------------------------------------------------------------

async def create_file(request: HttpRequest) -> Response:
    service = service_of(request)
    limit = request.app.state.server.settings.max_upload_bytes
    upload = await receive_upload(request, service.files_dir, limit)
    try:
        unknown = sorted(set(upload.fields) - {"purpose"})
        if unknown:
            raise ApiError(400, f"The form field {unknown[0]!r} cannot be honoured here (files do not expire, and "
                                f"only 'file' and 'purpose' are taken).", param=unknown[0])
        purpose = upload.fields.get("purpose")
        if purpose != BATCH_PURPOSE:
            raise ApiError(400, f"'purpose' must be \"batch\" (the files this server takes are Batch API inputs), "
                                f"got {json.dumps(purpose)}.", param="purpose")
        record = await _io(request, service.add_upload, upload, purpose)
    finally:
        upload.discard()  # a no-op once the file is in place
    return JSONResponse(file_object(record))


async def list_files(request: HttpRequest) -> Response:
    service = service_of(request)
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"'order' must be \"asc\" or \"desc\", got {json.dumps(order)}.", param="order")
    page = await _io(request, service.files, query.get("purpose"), query.get("after"),
                                   _limit(query.get("limit"), *FILE_LIST_LIMIT), order == "desc")
    return JSONResponse(list_object(page, file_object))


async def get_file(request: HttpRequest) -> Response:
    service = service_of(request)
    return JSONResponse(file_object(await _io(request, service.file, request.path_params["file_id"])))


async def file_content(request: HttpRequest) -> Response:
    """The file's bytes, streamed from disk."""
    service = service_of(request)
    record = await _io(request, service.file, request.path_params["file_id"])
    path = service.path_of(record)
    if not path.exists():
        raise ApiError(404, f"The file {record.id} has no content any more.", NOT_FOUND, "file_id", "file_not_found")
    return FileResponse(path, media_type="application/octet-stream")


async def delete_file(request: HttpRequest) -> Response:
    service = service_of(request)
    record = await _io(request, service.delete_file, request.path_params["file_id"])
    return JSONResponse({"id": record.id, "object": "file", "deleted": True})


# --- batches ------------------------------------------------------------------------------------

async def create_batch(request: HttpRequest) -> Response:
    service = service_of(request)
    body = await read_json(request, request.app.state.server.settings.max_body_bytes)
    unknown = sorted(set(body) - BATCH_FIELDS)
    if unknown:
        raise ApiError(400, f"The field {unknown[0]!r} cannot be honoured here.", param=unknown[0])
    input_file_id = body.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise ApiError(400, "'input_file_id' must be the id of an uploaded file.", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"'endpoint' must be one of {', '.join(ENDPOINTS)}, got {json.dumps(endpoint)}.",
                       param="endpoint")
    if body.get("completion_window") != COMPLETION_WINDOW:
        raise ApiError(400, f"'completion_window' must be \"{COMPLETION_WINDOW}\", got "
                            f"{json.dumps(body.get('completion_window'))}.", param="completion_window")
    metadata = _metadata(body.get("metadata"))
    record = await _io(request, service.create_batch, input_file_id, endpoint, metadata)
    return JSONResponse(batch_object(record))


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's metadata: up to 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None
    if (not isinstance(value, dict) or len(value) > MAX_METADATA_PAIRS
            or not all(isinstance(key, str) and isinstance(item, str) and len(key) <= MAX_METADATA_KEY
                       and len(item) <= MAX_METADATA_VALUE for key, item in value.items())):
        raise ApiError(400, f"'metadata' must be an object of at most {MAX_METADATA_PAIRS} string values, keys of "
                            f"at most {MAX_METADATA_KEY} characters and values of at most {MAX_METADATA_VALUE}.",
                       param="metadata")
    return value


async def get_batch(request: HttpRequest) -> Response:
    service = service_of(request)
    return JSONResponse(batch_object(await _io(request, service.batch, request.path_params["batch_id"])))


async def list_batches(request: HttpRequest) -> Response:
    service = service_of(request)
    query = request.query_params
    page = await _io(request, service.batches, query.get("after"),
                                   _limit(query.get("limit"), *BATCH_LIST_LIMIT))
    return JSONResponse(list_object(page, batch_object))


async def cancel_batch(request: HttpRequest) -> Response:
    service = service_of(request)
    return JSONResponse(batch_object(await _io(request, service.cancel_batch, request.path_params["batch_id"])))


def _limit(value: str | None, default: int, largest: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= largest:
        raise ApiError(400, f"'limit' must be a whole number from 1 to {largest}, got {json.dumps(value)}.",
                       param="limit")
    return int(value)


ROUTES = [
    Route("/v1/files", create_file, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", get_file, methods=["GET"]),
    Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]
