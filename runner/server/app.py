"""The OpenAI-compatible HTTP app: create_app(runner) builds it, starting nothing.

Routes: POST /v1/chat/completions and /v1/completions (streamed as server-sent events, or
not), GET /v1/models, GET /health (503 while the model loads, 200 when ready), GET /metrics,
and with a data directory the Files and Batch APIs (batch_api.py). A request body becomes
engine requests through multiseq.formats, the same translation batch-run applies to OpenAI
Batch lines, and results become response bodies the same way. Interactive requests run at
Priority.INTERACTIVE, above the Batch API's lines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..formats.fields import ItemError
from ..formats.openai_output import (INVALID_OUTPUT, INVALID_OUTPUT_CODE, INVALID_OUTPUT_STATUS, approximated_field,
                                     completion_body, response_id, schema_failure_message, stream_choice, stream_chunk,
                                     usage_of)
from ..formats.reader import PromptItem, openai_body_item
from ..runner import FinishReason, OverflowPolicy, Priority, Result, Runner, SamplingParams
from . import batch_api
from .batches import BatchRules, BatchService
from .bodies import read_json
from .errors import INVALID_REQUEST, NOT_FOUND, OVERLOADED, ApiError, error_body, internal_error
from .jobs import Job, PieceEvent, failure_of
from .metrics import ServerMetrics

logger = logging.getLogger("multiseq.server")

DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_UPLOAD_BYTES = 200 << 20  # OpenAI's limit for a batch input file
DEFAULT_MAX_BATCH_LINES = 50_000  # OpenAI's limit for the requests of one batch
RETRY_AFTER_SECONDS = 2
CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "multiseq"  # the model id /v1/models lists and requests may name (--alias)
    api_key: str | None = None  # when set, every /v1 route wants `Authorization: Bearer <key>`
    max_queue: int = DEFAULT_MAX_QUEUE  # requests waiting for a slot; beyond that, 503
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    # Sampling of requests that do not say; OpenAI's max_tokens default: what the window leaves.
    defaults: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=None))
    # A request that does not fit its slot is a 400 naming the numbers (never silently slid).
    overflow: OverflowPolicy = OverflowPolicy.REJECT
    # Where the Files and Batch APIs keep files, batches and results (None: those APIs are off).
    data_dir: Path | None = None
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES  # a larger upload gets 413
    max_batch_lines: int = DEFAULT_MAX_BATCH_LINES  # a batch with more requests fails validation

    def __post_init__(self) -> None:
        if min(self.max_queue, self.max_body_bytes, self.max_upload_bytes, self.max_batch_lines) < 1:
            raise ValueError("max_queue, max_body_bytes, max_upload_bytes and max_batch_lines must be >= 1")


class ServerState:
    """What the routes share: the runner (None while the model loads), settings, metrics."""

    def __init__(self, runner: Runner | None, settings: ServerSettings) -> None:
        self.runner = runner
        self.settings = settings
        self.metrics = ServerMetrics(lambda: self.runner)
        # StoreError when the data directory cannot be used.
        self.batches = None if settings.data_dir is None else BatchService(settings.data_dir, BatchRules(
            settings.model_name, settings.defaults, settings.overflow, settings.max_batch_lines))
        # Choices accepted but not yet handed to the runner (it counts them from then on).
        self._num_dispatching = 0
        self._dispatch_lock = threading.Lock()
        self.is_draining = False

    def _count_dispatching(self, change: int) -> None:
        with self._dispatch_lock:
            self._num_dispatching += change

    def attach(self, runner: Runner) -> None:
        """The model has loaded: requests are served, and batches run, from now on."""
        self.runner = runner
        self.start_batches()

    def start_batches(self) -> None:
        """Run batches once there is a runner (an app made with one starts them at the first
        Files or Batch API request; `multiseq serve` as soon as the model has loaded)."""
        if self.batches is not None and self.runner is not None and not self.is_draining:
            self.batches.start(self.runner)

    def begin_shutdown(self) -> None:
        """Stop taking requests and end the running ones (their streams end cleanly). Batch
        work stops first, so no new line takes a slot; its cancelled lines run again next time."""
        self.is_draining = True
        if self.batches is not None:
            self.batches.stop()
        if self.runner is not None:
            self.runner.cancel_all()

    def close(self) -> None:
        """After the server has stopped, before the runner closes: wait for the batch worker
        (its cancelled requests end at the runner's next step) and close the database."""
        if self.batches is not None:
            self.batches.close()

    def ready_runner(self) -> Runner:
        if self.is_draining:
            raise ApiError(503, "The server is shutting down.", OVERLOADED, code="shutting_down")
        if self.runner is None:
            raise ApiError(503, "The model is loading; try again shortly.", OVERLOADED, code="model_loading",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        return self.runner

    def check_model(self, name: Any) -> None:
        if name is not None and name != self.settings.model_name:
            raise ApiError(404, f"The model {json.dumps(name)} does not exist: this server serves "
                                f"{json.dumps(self.settings.model_name)}.", INVALID_REQUEST, "model",
                           "model_not_found")

    async def submit(self, runner: Runner, item: PromptItem) -> Job:
        """Queue a request's choices, or 503 when the queue is full. Tokenizing runs off the
        event loop, so a long prompt never stalls other clients' streams."""
        waiting = runner.num_waiting + self._num_dispatching
        if waiting + item.n > self.settings.max_queue and self.batches is not None:
            waiting -= self.batches.num_waiting_lines(runner)  # the queue limit is for interactive requests
        if waiting + item.n > self.settings.max_queue:
            raise ApiError(503, f"The server is busy: {waiting} requests are waiting for a slot (at most "
                                f"{self.settings.max_queue}). Retry later.", OVERLOADED, code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        job = Job(runner, item, asyncio.get_running_loop(), response_id(item.is_chat))
        self._count_dispatching(item.n)
        try:
            await asyncio.to_thread(job.submit, lambda: self._count_dispatching(-1))
        except BaseException:
            self._count_dispatching(-(item.n - job.num_dispatched))
            raise
        refused = job.rejection()
        if refused is not None:
            raise ApiError(400, refused.error or "the request cannot run", INVALID_REQUEST,
                           "messages" if item.is_chat else "prompt", "context_length_exceeded"
                           if "context window" in (refused.error or "") else None)
        return job


def state_of(request: HttpRequest) -> ServerState:
    return request.app.state.server


# --- the routes ---------------------------------------------------------------------------------

async def health(request: HttpRequest) -> Response:
    state = state_of(request)
    if state.is_draining:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    if state.runner is None:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return JSONResponse({"status": "ok"})


async def metrics(request: HttpRequest) -> Response:
    return Response(generate_latest(state_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.settings.model_name, "object": "model", "created": 0, "owned_by": "multiseq"}


async def list_models(request: HttpRequest) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(state_of(request))]})


async def get_model(request: HttpRequest) -> Response:
    state = state_of(request)
    state.check_model(request.path_params["model"])
    return JSONResponse(_model_card(state))


async def chat_completions(request: HttpRequest) -> Response:
    return await _complete(request, is_chat=True)


async def completions(request: HttpRequest) -> Response:
    return await _complete(request, is_chat=False)


async def _complete(request: HttpRequest, is_chat: bool) -> Response:
    state = state_of(request)
    runner = state.ready_runner()
    body = await read_json(request, state.settings.max_body_bytes)
    state.check_model(body.get("model"))
    stream, include_usage = _stream_options(body)
    try:  # off the event loop: a schema seen for the first time is compiled here
        item = await asyncio.to_thread(openai_body_item, uuid.uuid4().hex, body, is_chat, state.settings.defaults)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    item = dataclasses.replace(item, request=dataclasses.replace(item.request, overflow=state.settings.overflow,
                                                                 priority=Priority.INTERACTIVE))
    job = await state.submit(runner, item)
    if stream:
        return EventStream(_stream_events(job, state, include_usage), on_disconnect=job.cancel)
    results = await _results_unless_disconnected(request, job)
    if results is None:  # the client went away: its requests were cancelled, no one to answer
        return Response(status_code=499)
    _observe_latency(state, job, results)
    failure = failure_of(results)
    if failure is not None:
        raise _failure_error(failure, results.index(failure), len(results))
    return JSONResponse(completion_body(item, results, state.settings.model_name, job.body_id))


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be true or false, got {json.dumps(stream)}", param="stream")
    options = body.get("stream_options")
    if options is None:
        return bool(stream), False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise ApiError(400, "'stream_options' must be an object such as {\"include_usage\": true}",
                       param="stream_options")
    if not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
    return True, options.get("include_usage", False)


async def _results_unless_disconnected(request: HttpRequest, job: Job) -> list[Result] | None:
    """The job's results, or None when the client disconnects first (the job is cancelled)."""
    finished = asyncio.ensure_future(job.all_results())
    gone = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not finished.done():
            finished.cancel()
            job.cancel()
    return finished.result() if finished.done() and not finished.cancelled() else None


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _failure_error(failure: Result, choice: int, num_choices: int) -> ApiError:
    if failure.schema_error is not None:  # the output ended, but the schema could only be approximated
        return ApiError(INVALID_OUTPUT_STATUS, schema_failure_message(failure, choice, num_choices), INVALID_OUTPUT,
                        "response_format", INVALID_OUTPUT_CODE)
    if failure.finish_reason is FinishReason.CANCELLED:
        return ApiError(503, "The server is shutting down; the request was cancelled.", OVERLOADED,
                        code="shutting_down")
    logger.error("request %s failed: %s", failure.id, failure.error)
    return internal_error()


def _observe_latency(state: ServerState, job: Job, results: list[Result]) -> None:
    ttfts = [result.timings.ttft_s for result in results if result.timings.ttft_s is not None]
    if ttfts:
        state.metrics.ttft.observe(min(ttfts))


# --- streaming ----------------------------------------------------------------------------------

def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream_events(job: Job, state: ServerState, include_usage: bool) -> AsyncIterator[str]:
    """The server-sent events of a streamed response: a first chunk per choice (chat: its
    role), one per piece of text, a last one per choice with its finish_reason, the usage
    when asked for, then [DONE]. A choice that fails ends the stream with an error event."""
    item, model = job.item, state.settings.model_name
    is_chat, created = item.is_chat, int(time.time())
    wants_logprobs = item.request.sampling.logprobs

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        return _sse(stream_chunk(is_chat, job.body_id, created, model, choices, usage, include_usage))

    if is_chat:
        yield chunk([stream_choice(True, index, None, () if wants_logprobs else None, first=True)
                     for index in range(item.n)])
    streamed_logprobs = [0] * item.n
    text_length = [0] * item.n
    last_piece_at: list[float | None] = [None] * item.n
    first_token_seen = False
    async for event in job.events_until_complete():
        if isinstance(event, PieceEvent):
            if not first_token_seen:
                first_token_seen = True
                state.metrics.ttft.observe(event.at - job.arrived_at)
            if last_piece_at[event.choice] is not None:
                state.metrics.inter_token.observe(event.at - last_piece_at[event.choice])
            last_piece_at[event.choice] = event.at
            logprobs = event.piece.logprobs if wants_logprobs else None
            yield chunk([stream_choice(is_chat, event.choice, event.piece.text, logprobs,
                                       text_offset=text_length[event.choice])])
            streamed_logprobs[event.choice] += len(event.piece.logprobs)
            text_length[event.choice] += len(event.piece.text)
            continue
        result = event.result
        if not result.ok:
            error = _failure_error(result, event.choice, item.n)
            yield _sse(error.body())
            job.cancel()
            yield _sse("[DONE]")
            return
        rest = result.logprobs[streamed_logprobs[event.choice]:] if wants_logprobs and result.logprobs else None
        last = stream_choice(is_chat, event.choice, None, rest if wants_logprobs else None,
                             result.finish_reason.value, text_offset=text_length[event.choice])
        yield _sse(stream_chunk(is_chat, job.body_id, created, model, [last], None, include_usage)
                   | approximated_field([result]))
    if include_usage:
        yield chunk([], usage_of([job.results[choice] for choice in range(item.n)]))
    yield _sse("[DONE]")


class EventStream:
    """A text/event-stream response that watches for the client going away the whole time (a
    request still queued sends nothing, so a failed write would never tell): then it cancels
    the job at once, which frees its slot at the runner's next step."""

    def __init__(self, events: AsyncIterator[str], on_disconnect: Callable[[], None]) -> None:
        self._events = events
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                await _disconnect(receive)
                self._on_disconnect()
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no")]})
                async for event in self._events:
                    await send({"type": "http.response.body", "body": event.encode("utf-8"), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:  # the connection broke while writing
                self._on_disconnect()
            except Exception:  # noqa: BLE001 - the status is sent; tell the client in the stream, log the rest
                logger.exception("a streamed response failed")
                self._on_disconnect()
                await _send_quietly(send, _sse(internal_error().body()) + _sse("[DONE]"))
            finally:
                group.cancel_scope.cancel()


async def _send_quietly(send: Send, text: str) -> None:
    try:
        await send({"type": "http.response.body", "body": text.encode("utf-8"), "more_body": False})
    except OSError:
        pass


# --- errors, authentication, the app ------------------------------------------------------------

async def _api_error(request: HttpRequest, error: ApiError) -> Response:
    return error.response()


async def _http_error(request: HttpRequest, error: HTTPException) -> Response:
    if error.status_code == 404:
        return ApiError(404, f"There is no route {request.method} {request.url.path}.", NOT_FOUND,
                        code="unknown_url").response()
    if error.status_code == 405:
        return ApiError(405, f"{request.url.path} does not take {request.method}.", INVALID_REQUEST,
                        code="method_not_allowed").response()
    return ApiError(error.status_code, str(error.detail), INVALID_REQUEST).response()


async def _unexpected_error(request: HttpRequest, error: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return internal_error().response()


class ApiKeyGuard:
    """Every /v1 route wants `Authorization: Bearer <key>`, compared in constant time;
    /health and /metrics stay open."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self._key = api_key.encode("utf-8") if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._key is not None and scope["path"].startswith("/v1"):
            scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
            if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8"), self._key)):
                response = JSONResponse(error_body("Incorrect or missing API key: send 'Authorization: Bearer "
                                                   "<key>'.", INVALID_REQUEST, None, "invalid_api_key"),
                                        status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(runner: Runner | None = None, settings: ServerSettings | None = None) -> Starlette:
    """The ASGI app over `runner` (None: not loaded yet; attach it later with
    app.state.server.attach(runner), /health answering 503 until then). Nothing is started:
    serve it with uvicorn, or mount it in an app of your own. With settings.data_dir, its
    database is opened here (StoreError when the folder cannot be used); call
    app.state.server.close() once the server has stopped."""
    settings = settings or ServerSettings()
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route(CHAT_ENDPOINT, chat_completions, methods=["POST"]),
        Route(COMPLETIONS_ENDPOINT, completions, methods=["POST"]),
        *batch_api.ROUTES,
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected_error})
    app.state.server = ServerState(runner, settings)
    app.add_middleware(ApiKeyGuard, api_key=settings.api_key)
    return app

