"""Chat Completions and Completions as functions: the one path every API's requests take.

start_chat() turns an OpenAI Chat Completions body into engine requests and queues them; the
CompletionCall it returns gives the whole chat.completion body, or the chat.completion.chunk
bodies of a stream. The /v1/chat/completions and /v1/completions routes are these calls
serialized; the Responses and Anthropic Messages APIs translate their bodies into Chat
Completions bodies at their doors and their answers out of these, so one conversation renders
to the same prompt tokens (and hits the same cache) whichever API carries it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from ..config import is_int, is_number
from ..errors import BackendError
from ..formats.fields import ItemError
from ..formats.openai_output import (INVALID_OUTPUT, INVALID_OUTPUT_CODE, INVALID_OUTPUT_STATUS, approximated_field,
                                     chat_deltas, completion_body, echoed_logprobs, schema_failure_message, stop_reason,
                                     stream_choice, stream_chunk, usage_of)
from ..formats.reader import openai_body_item, unknown_body_fields
from ..request import FinishReason, Priority, Result
from ..tools import Delta
from .bodies import read_json
from .errors import INVALID_REQUEST, OVERLOADED, ApiError, internal_error
from .jobs import MAX_QUEUED_EVENTS, Job, PieceEvent, ResultEvent, failure_of
from .sse import EventStream, sse, wait_for_disconnect
from .state import ServerState

logger = logging.getLogger("multiseq.server")

# Names the body fields this server did not know and left out (without --strict-fields).
IGNORED_FIELDS_HEADER = "x-multiseq-ignored-fields"
MAX_IGNORED_FIELDS_HEADER = 1024  # characters: a body may hold any number of fields


def _state(request: HttpRequest) -> ServerState:
    return request.app.state.server


class CompletionCall:
    """One OpenAI request running in the engine (its choices), and its answer in OpenAI's shapes."""

    def __init__(self, state: ServerState, job: Job, model: str) -> None:
        self._state = state
        self.job = job
        self.body_id = job.body_id
        self.model = model  # the served model's name, as the answer says it

    @property
    def is_chat(self) -> bool:
        return self.job.item.is_chat

    def cancel(self) -> None:
        self.job.cancel()

    async def completion(self, request: HttpRequest) -> dict[str, Any] | None:
        """The whole chat.completion (or text_completion) body; None when the client went away
        first (its requests are cancelled). Raises ApiError when a choice failed."""
        results = await self.results(request)
        if results is None:
            return None
        return completion_body(self.job.item, results, self.model, self.body_id)

    async def results(self, request: HttpRequest) -> list[Result] | None:
        """Every choice's result; None when the client went away first (its requests are
        cancelled). Raises ApiError when a choice failed."""
        results = await _results_unless_disconnected(request, self.job)
        if results is None:
            return None
        _observe_latency(self._state, results)
        failure = failure_of(results)
        if failure is not None:
            raise _failure_error(failure, results.index(failure), len(results), self._unloaded())
        return results

    async def events(self) -> AsyncIterator[Delta | Result | ApiError]:
        """The answer as the Responses, Messages and /completion streams render it: what each
        piece reads as (the engine's own deltas: text, reasoning, a call's start, a piece of its
        arguments), each choice's Result when it ends; a choice that fails ends them with its
        ApiError (the chunks' failure path: `_progress`)."""
        async for event in self._progress():
            if isinstance(event, PieceEvent):
                for delta in event.piece.parsed:
                    yield delta
            else:
                yield event if isinstance(event, ApiError) else event.result

    def _unloaded(self) -> str | None:
        """The model's name when it was unloaded under this request (its runner is no longer the
        model's), and the server is not shutting down: what cancelled it then."""
        model = self._state.models.named(self.model) if self.model else None
        if model is None or self._state.is_draining or model.runner is self.job.runner:
            return None
        return model.name

    async def _progress(self) -> AsyncIterator[PieceEvent | ResultEvent | ApiError]:
        """The job's events as a stream renders them, each piece timed for the metrics; a choice
        that failed (or a client too slow to keep up) ends them with its error, the other
        choices cancelled: the one failure path of every stream."""
        job = self.job
        latency = _LatencyObserver(self._state, job)
        async for event in job.events_until_complete():
            if isinstance(event, PieceEvent):
                latency.observe(event)
            elif not event.result.ok:
                job.cancel()
                error = _too_slow_error() if job.is_overrun else _failure_error(event.result, event.choice,
                                                                                job.item.n, self._unloaded())
                if job.streams:  # its status went out as a 200: the page lists the error the stream ends with
                    self._state.monitor.note_failed_stream(error.status, error.message)
                yield error
                return
            yield event

    async def chunks(self, include_usage: bool = True) -> AsyncIterator[dict[str, Any]]:
        """The chunk bodies of a streamed answer: a first chunk per choice (chat: its role), one
        per piece of text (with tools: per parsed delta, text that may begin a call held back),
        a last one per choice with its finish_reason, then the usage when asked for. A choice
        that fails is yielded as an error body ({"error": {...}}), and ends the stream."""
        job = self.job
        item, model, is_chat, created = job.item, self.model, job.item.is_chat, int(time.time())
        wants_logprobs = item.request.sampling.logprobs

        def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
            return stream_chunk(is_chat, job.body_id, created, model, choices, usage, include_usage)

        if is_chat:
            yield chunk([stream_choice(True, index, None, () if wants_logprobs else None, first=True)
                         for index in range(item.n)])
        streamed_logprobs = [0] * item.n
        # Where a choice's next logprob entry's text starts: the entries' texts summed, as the
        # whole answer counts them (a piece's text may differ: bytes of a character held back).
        offsets = [0] * item.n
        echoing = [item.echo] * item.n  # choices whose prompt is still to be echoed
        async for event in self._progress():
            if isinstance(event, ApiError):
                yield event.body()
                return
            if echoing[event.choice]:
                echoing[event.choice] = False
                echo = _echoed_prompt(item, event, wants_logprobs)
                offsets[event.choice] = sum(map(len, echo["logprobs"]["tokens"])) if echo["logprobs"] else 0
                yield chunk([echo])
            if isinstance(event, PieceEvent):
                if item.echo_only:  # the one token run to score the prompt is not part of the answer
                    continue
                piece = event.piece
                logprobs = piece.logprobs if wants_logprobs else None
                for delta in _piece_deltas(is_chat, piece):
                    yield chunk([stream_choice(is_chat, event.choice, piece.text, logprobs,
                                               text_offset=offsets[event.choice], delta=delta)])
                    logprobs = () if wants_logprobs else None  # a piece's logprobs go with its first chunk
                streamed_logprobs[event.choice] += len(piece.logprobs)
                offsets[event.choice] += sum(len(entry.text) for entry in piece.logprobs)
                continue
            result = event.result
            rest = result.logprobs[streamed_logprobs[event.choice]:] if wants_logprobs and result.logprobs else None
            if item.echo_only:
                rest, result = (() if wants_logprobs else None), dataclasses.replace(result, finish_reason=FinishReason.LENGTH)
            elif item.echo and wants_logprobs and result.end_logprob:
                rest = (*(rest or ()), result.end_logprob)  # as the whole answer has it: the token that ended it
            last = stream_choice(is_chat, event.choice, None, rest if wants_logprobs else None,
                                 result.finish_reason.value, text_offset=offsets[event.choice])
            last |= stop_reason(result)
            yield chunk([last]) | approximated_field([result])
        if include_usage:
            yield chunk([], usage_of([job.results[choice] for choice in range(item.n)],
                                     len(item.prompt_requests) or 1, item.echo_only))


def _echoed_prompt(item: Any, event: PieceEvent | Any, wants_logprobs: bool) -> dict[str, Any]:
    """A streamed completion's first chunk with echo: its prompt's text, and with logprobs
    their entries (the first null), as soon as the prompt was computed (its first piece
    carries them; a choice that ended without a piece, from its result)."""
    if isinstance(event, PieceEvent):
        first, scores = event.piece.prompt_first_token, event.piece.prompt_logprobs or ()
    else:
        first, scores = (event.result.prompt_token_bytes or (b"",))[0], event.result.prompt_logprobs or ()
    request = item.requests[event.choice]
    text = request.prompt if isinstance(request.prompt, str) else \
        b"".join((first, *(entry.token_bytes for entry in scores))).decode("utf-8", "replace")
    logprobs = echoed_logprobs(first, scores) if wants_logprobs else None
    return {"index": event.choice, "text": text, "logprobs": logprobs, "finish_reason": None}


def _piece_deltas(is_chat: bool, piece: Any) -> list[dict[str, Any] | None]:
    """The chat deltas a piece streams as: its parsed deltas where the request has a parser
    (none while text is held back), else one delta of its text (None: built from the text)."""
    if not is_chat or piece.deltas is None:
        return [None] if piece.text else []
    return chat_deltas(piece.deltas)


class _LatencyObserver:
    """Time to first token and the gaps between pieces, as clients of a stream see them."""

    def __init__(self, state: ServerState, job: Job) -> None:
        self._state = state
        self._job = job
        self._last_piece_at: dict[int, float] = {}

    def observe(self, event: PieceEvent) -> None:
        if not self._last_piece_at:
            self._state.metrics.ttft.observe(event.at - self._job.arrived_at)
        previous = self._last_piece_at.get(event.choice)
        if previous is not None:
            self._state.metrics.inter_token.observe(event.at - previous)
        self._last_piece_at[event.choice] = event.at


def adapter_of_lora_field(lora: Any, config) -> str | None:
    """llama-server's per-request `lora` ([{"id", "scale"}], ids as /lora-adapters lists them:
    the whole model's adapters, then --lora-modules) as the adapter module it picks (None: the
    model's own set). The whole model's adapters stay at their scales, and a request runs one
    module at its scale: a 400 saying so for any other choice."""
    modules, first = config.lora_modules, len(config.lora)
    if not isinstance(lora, list) or not all(isinstance(entry, dict) and is_int(entry.get("id"))
                                             and is_number(entry.get("scale", 0.0)) for entry in lora):
        raise ApiError(400, "'lora' must be a list of {\"id\": N, \"scale\": X} (the ids of /lora-adapters)",
                       INVALID_REQUEST, "lora")
    picked = []
    for entry in lora:
        index, scale = entry["id"], float(entry.get("scale", 0.0))
        if not 0 <= index < first + len(modules):
            raise ApiError(400, f"'lora' names adapter {index}: /lora-adapters lists {first + len(modules)}",
                           INVALID_REQUEST, "lora")
        configured = config.lora[index][1] if index < first else modules[index - first][2]
        if scale and scale != configured or (index < first and not scale):
            raise ApiError(400, f"adapter {index} runs at scale {configured:g} here (set at start); a request "
                                f"picks one of the --lora-modules at its scale, or none", INVALID_REQUEST, "lora")
        if scale and index >= first:
            picked.append(modules[index - first][0])
    if len(picked) > 1:
        raise ApiError(400, "a request runs one of the --lora-modules at a time", INVALID_REQUEST, "lora")
    return picked[0] if picked else None


async def start_completion(request: HttpRequest, body: dict[str, Any], is_chat: bool, api: str) -> CompletionCall:
    """Validate an OpenAI Chat Completions (is_chat) or Completions body and queue its choices at
    interactive priority. `api` names the API it came through, for the metrics. Raises
    ApiError (OpenAI's shape, naming the field) when it cannot run."""
    state = _state(request)
    runner, model = await state.runner_for(body.get("model"))
    # A LoRA adapter served as a model (its base runs it), or llama-server's per-request `lora`.
    lora, body = body.get("lora"), {name: value for name, value in body.items() if name != "lora"}
    adapter = state.models.adapter_of(body.get("model")) or (
        None if lora is None else adapter_of_lora_field(lora, runner.config))
    try:  # in the prepare threads: a schema or a tool set seen for the first time is compiled here
        item = await state.offload.prepare(openai_body_item, uuid.uuid4().hex, body, is_chat, state.settings.defaults)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    item = dataclasses.replace(item, request=dataclasses.replace(item.request, overflow=state.settings.overflow,
                                                                 priority=Priority.INTERACTIVE, adapter=adapter))
    state.metrics.requests.labels(api).inc()
    # Only a stream's pieces are read as they come (each piece's deltas); a whole answer's
    # output is read once, when it ends.
    return CompletionCall(state, await state.submit(runner, item, streams=body.get("stream") is True), model)


async def start_chat(request: HttpRequest, body: dict[str, Any], api: str = "chat") -> CompletionCall:
    """A Chat Completions body, queued: what the Responses and Messages APIs translate into."""
    return await start_completion(request, body, True, api)


async def count_prompt_tokens(request: HttpRequest, body: dict[str, Any]) -> int:
    """How many tokens a Chat Completions body's prompt (messages and tools, rendered with the
    model's template) comes to. Raises ApiError like start_chat."""
    state = _state(request)
    runner, _ = await state.runner_for(body.get("model"))
    try:
        item = await state.offload.prepare(openai_body_item, uuid.uuid4().hex, body, True, state.settings.defaults)
        return len(await state.offload.prepare(runner.prompt_tokens, item.request))
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    except (ValueError, BackendError) as error:
        raise ApiError(400, str(error), INVALID_REQUEST, "messages") from None


# --- the routes ---------------------------------------------------------------------------------

async def chat_completions(request: HttpRequest) -> Response:
    return await _complete(request, is_chat=True)


async def completions(request: HttpRequest) -> Response:
    return await _complete(request, is_chat=False)


async def _complete(request: HttpRequest, is_chat: bool) -> Response:
    state = _state(request)
    body = await read_json(request, state.settings.max_body_bytes)
    # Clients (LiteLLM, OpenHands, vLLM's) add fields of their own: left out and named, unless
    # the server was told to refuse them (openai_body_item then names the first).
    ignored = [] if state.settings.strict_fields else unknown_body_fields(body, is_chat)
    ignored = [name for name in ignored if name != "lora"]  # llama-server's, read by start_completion
    body = {name: value for name, value in body.items() if name not in ignored}
    headers = ignored_fields_header(ignored)
    stream, include_usage = _stream_options(body)
    call = await start_completion(request, body, is_chat, "chat" if is_chat else "completions")
    if stream:
        return EventStream(_sse_of(call.chunks(include_usage)), on_disconnect=call.cancel, headers=headers)
    completion = await call.completion(request)
    if completion is None:  # the client went away: its requests were cancelled, no one to answer
        return Response(status_code=499)
    return JSONResponse(completion, headers=headers)


def ignored_fields_header(names: list[str]) -> dict[str, str]:
    """The fields left out, as a header (printable ASCII, and bounded: the names are the client's)."""
    if not names:
        return {}
    value = "".join(char if " " <= char <= "~" else "?" for char in ", ".join(names))
    if len(value) > MAX_IGNORED_FIELDS_HEADER:
        value = value[:MAX_IGNORED_FIELDS_HEADER - 3] + "..."
    return {IGNORED_FIELDS_HEADER: value}


async def _sse_of(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield sse(chunk)
    yield sse("[DONE]")


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
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not finished.done():
            finished.cancel()
            job.cancel()
    return finished.result() if finished.done() and not finished.cancelled() else None


def _failure_error(failure: Result, choice: int, num_choices: int, unloaded: str | None = None) -> ApiError:
    if failure.schema_error is not None:  # the output ended, but the schema could only be approximated
        return ApiError(INVALID_OUTPUT_STATUS, schema_failure_message(failure, choice, num_choices), INVALID_OUTPUT,
                        "response_format", INVALID_OUTPUT_CODE)
    if failure.finish_reason is FinishReason.CANCELLED and unloaded is not None:
        return ApiError(503, f"The model {unloaded!r} was unloaded; the request was cancelled. Retry to load it "
                             f"again.", OVERLOADED, code="model_unloaded")
    if failure.finish_reason is FinishReason.CANCELLED:
        return ApiError(503, "The server is shutting down; the request was cancelled.", OVERLOADED,
                        code="shutting_down")
    logger.error("request %s failed: %s", failure.id, failure.error)
    return internal_error()


def _too_slow_error() -> ApiError:
    return ApiError(503, f"The client read this stream too slowly (it fell {MAX_QUEUED_EVENTS} pieces behind); the "
                         f"request was cancelled.", OVERLOADED, code="client_too_slow")


def _observe_latency(state: ServerState, results: list[Result]) -> None:
    ttfts = [result.timings.ttft_s for result in results if result.timings.ttft_s is not None]
    if ttfts:
        state.metrics.ttft.observe(min(ttfts))
