"""Ollama's API on the same server, for the tools that speak only it (its Python and JavaScript
clients, langchain-ollama, Open WebUI's Ollama connection, editor plugins).

`/api/chat` and `/api/generate` are translated at the door onto the Chat Completions path
(multiseq.server.ollama_request), so a conversation renders to the same prompt, and reuses the
same cache, whichever API carries it; their answers are streamed as Ollama streams them, one
JSON object a line (`application/x-ndjson`), the last with `done` and the counts. `/api/embed`
(vectors normalized, as Ollama's) and the older `/api/embeddings` run on the embedding path;
`/api/tags`, `/api/show` and `/api/ps` describe the served model; `/api/version` says which
Ollama API this answers as. Errors are Ollama's shape, {"error": "..."}, with the status the
other APIs give. The door rules are the server's own (key, Host and Origin, body bounds).
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..config import RANK
from ..loop.runner import Runner
from ..formats.embeddings import EUCLIDEAN, embedding_inputs, embedding_values, input_requests
from ..formats.fields import ItemError
from ..formats.reader import embeddings_item
from ..request import FinishReason, Result
from ..tools import ArgumentsDelta, ReasoningDelta, TextDelta, ToolCallStart
from .bodies import read_json
from .chat import CompletionCall, start_completion
from .embeddings import embedded
from .errors import INVALID_REQUEST, ApiError, in_error_shape, internal_error
from .native import infill_prompt
from .ollama_pull import delete, pull
from .ollama_request import OllamaCall, chat_call, generate_call, keep_alive_of
from .sse import EventStream


# The Ollama API whose routes and fields these answer as (clients compare it with what they need).
OLLAMA_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"
NOT_NORMALIZED = -1  # Ollama's /api/embed normalizes; its older /api/embeddings does not


def _error_response(error: ApiError) -> Response:
    return JSONResponse({"error": error.message}, status_code=error.status, headers=error.headers)


_in_ollama_shape = in_error_shape(_error_response)  # errors of an Ollama route in its shape


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


async def _picked(request: HttpRequest, model: str, keep_alive_s: float | None = None) -> tuple[Runner, str]:
    """The runner of the model `model` names (with or without Ollama's ":latest"), loaded if it
    is not, and the model's name; Ollama's 404 when none is served under that name."""
    try:
        return await request.app.state.server.runner_for(model, keep_alive_s)
    except ApiError as error:
        if error.status == 404:
            raise ApiError(404, f"model '{model}' not found", INVALID_REQUEST, "model") from None
        raise


# --- generating ----------------------------------------------------------------------------------

@_in_ollama_shape
async def chat(request: HttpRequest) -> Response:
    """POST /api/chat."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    translated = chat_call(body)
    if not translated.body["messages"]:  # Ollama loads the model (or with keep_alive 0 unloads it) and says so
        return JSONResponse(await _loaded_or_unloaded(request, translated.model, body, "chat"))
    _, model = await _picked(request, translated.model, keep_alive_of(body.get("keep_alive")))
    return await _generated(request, translated, model, "chat")


@_in_ollama_shape
async def generate(request: HttpRequest) -> Response:
    """POST /api/generate (`suffix`: the text after the cursor, laid out for fill-in-the-middle)."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    translated = generate_call(body)  # a body that cannot run is refused before any model loads
    if not body.get("prompt") and not body.get("images") and not body.get("suffix"):
        return JSONResponse(await _loaded_or_unloaded(request, translated.model, body, "generate"))
    runner, model = await _picked(request, translated.model, keep_alive_of(body.get("keep_alive")))
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise ApiError(400, "'suffix' must be a string", INVALID_REQUEST, "suffix")
    if suffix:
        laid_out, _ = await infill_prompt(request, runner, {"input_prefix": body.get("prompt") or "",
                                                            "input_suffix": suffix},
                                          "'suffix' needs the model's fill-in-the-middle tokens; this model has no "
                                          "{tokens} token", "suffix")
        translated = generate_call(body, laid_out)
    return await _generated(request, translated, model, "generate")


async def _loaded_or_unloaded(request: HttpRequest, name: str, body: dict[str, Any], kind: str) -> dict[str, Any]:
    """A request with nothing to answer: the model loaded, or with keep_alive 0 unloaded (Ollama's ways)."""
    state = request.app.state.server
    keep_alive = keep_alive_of(body.get("keep_alive"))
    empty = {"role": "assistant", "content": ""} if kind == "chat" else ""
    if keep_alive == 0:
        try:
            model = state.models.pick(name)
        except ApiError:
            raise ApiError(404, f"model '{name}' not found", INVALID_REQUEST, "model") from None
        if state.loader is not None:
            await state.loader.unload(model)
        return _line(model.name, kind, empty, done="unload")
    _, model_name = await _picked(request, name, keep_alive)
    return _line(model_name, kind, empty, done="load")


async def _generated(request: HttpRequest, translated: OllamaCall, model: str, kind: str) -> Response:
    call = await start_completion(request, translated.body | {"model": model}, translated.is_chat, f"ollama-{kind}")
    if translated.stream:
        return EventStream(_lines(call, model, kind), on_disconnect=call.cancel, media_type=NDJSON, keep_alive=None,
                           error_event=lambda: _json_line({"error": internal_error().message}))
    results = await call.results(request)
    if results is None:  # the client went away: its request was cancelled
        return Response(status_code=499)
    result = results[0]
    message = _message(result) if kind == "chat" else result.text
    extra = {"thinking": result.reasoning} if kind == "generate" and result.reasoning else {}
    return JSONResponse(_line(model, kind, message, done=_done_reason(result)) | extra | _counts(result))


async def _lines(call: CompletionCall, model: str, kind: str) -> AsyncIterator[str]:
    """The stream: a line per piece of text or reasoning, a line per call once its arguments
    are whole (Ollama's calls come whole), then the last line with the counts."""
    calls: dict[int, list[str]] = {}  # index -> [name, arguments so far], for the call being written
    async for event in call.events():
        if isinstance(event, ApiError):
            yield _json_line({"error": event.message})
            return
        if isinstance(event, (ToolCallStart, Result)) and calls:
            yield _json_line(_line(model, kind, _calls_message(calls)))
            calls = {}
        if isinstance(event, TextDelta) and event.text:
            yield _json_line(_line(model, kind, {"role": "assistant", "content": event.text} if kind == "chat"
                                   else event.text))
        elif isinstance(event, ReasoningDelta) and event.text:
            thinking = {"role": "assistant", "content": "", "thinking": event.text}
            yield _json_line(_line(model, kind, thinking) if kind == "chat"
                             else _line(model, kind, "") | {"thinking": event.text})
        elif isinstance(event, ToolCallStart):
            calls[event.index] = [event.name, ""]
        elif isinstance(event, ArgumentsDelta) and event.index in calls:
            calls[event.index][1] += event.text
        elif isinstance(event, Result):
            empty = {"role": "assistant", "content": ""} if kind == "chat" else ""
            yield _json_line(_line(model, kind, empty, done=_done_reason(event)) | _counts(event))


def _line(model: str, kind: str, said: Any, done: str | None = None) -> dict[str, Any]:
    """One object of an answer: what it says (a chat's message, a generation's response)."""
    line = {"model": model, "created_at": _now(), "message" if kind == "chat" else "response": said,
            "done": done is not None}
    return line | ({"done_reason": done} if done is not None else {})


def _json_line(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False) + "\n"


def _message(result: Result) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if result.reasoning:
        message["thinking"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [_call(call.name, call.arguments) for call in result.tool_calls]
    return message


def _calls_message(calls: dict[int, list[str]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [_call(name, text) for name, text in calls.values()]}


def _call(name: str, arguments: str) -> dict[str, Any]:
    """A call as Ollama writes it: its arguments an object."""
    try:
        parsed = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        parsed = {}
    return {"function": {"name": name, "arguments": parsed}}


def _done_reason(result: Result) -> str:
    if result.finish_reason is FinishReason.LENGTH:
        return "length"
    return "stop"


def _counts(result: Result) -> dict[str, int]:
    """Ollama's counts and durations (nanoseconds): the prompt's tokens and the time computing
    those not reused took, the generated tokens and their time, the whole request's."""
    timings = result.timings
    computed = result.prompt_tokens - result.prompt_tokens_cached
    prompt_s = computed / timings.prefill_tokens_per_s if timings.prefill_tokens_per_s else 0.0
    decode_s = max(0, result.completion_tokens - 1) / timings.decode_tokens_per_s if timings.decode_tokens_per_s \
        else 0.0
    return {"total_duration": int(timings.total_s * 1e9), "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens, "prompt_eval_duration": int(prompt_s * 1e9),
            "eval_count": result.completion_tokens, "eval_duration": int(decode_s * 1e9)}


# --- embeddings ----------------------------------------------------------------------------------

@_in_ollama_shape
async def embed(request: HttpRequest) -> Response:
    """POST /api/embed: a normalized vector per input (`input`: a string or a list of them)."""
    results, model = await _embeddings(request, "input")
    vectors = [embedding_values(result.embedding, EUCLIDEAN) for result in results]
    return JSONResponse({"model": model, "embeddings": vectors,
                         "total_duration": int(max(result.timings.total_s for result in results) * 1e9),
                         "load_duration": 0, "prompt_eval_count": sum(result.prompt_tokens for result in results)})


@_in_ollama_shape
async def embeddings(request: HttpRequest) -> Response:
    """POST /api/embeddings, Ollama's older door: one `prompt`, its vector as the model pools it."""
    results, _ = await _embeddings(request, "prompt")
    return JSONResponse({"embedding": embedding_values(results[0].embedding, NOT_NORMALIZED)})


async def _embeddings(request: HttpRequest, field: str) -> tuple[list[Result], str]:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, model = await _picked(request, body.get("model") if isinstance(body.get("model"), str) else "",
                                  keep_alive_of(body.get("keep_alive")))
    if runner.pooling in ("none", RANK):
        raise ApiError(400, f"this server's model gives no pooled embedding (--pooling {runner.pooling})",
                       INVALID_REQUEST, field)
    item_id = uuid.uuid4().hex
    try:
        inputs = embedding_inputs(body.get(field), field)
        if field == "prompt" and len(inputs) != 1:
            raise ItemError("'prompt' must be one string", field)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    item = embeddings_item(item_id, input_requests(item_id, inputs, runner.pooling))
    results = await embedded(request, runner, item, field)
    if results is None:
        raise ApiError(499, "the client went away", INVALID_REQUEST)
    return results, model


# --- the model -----------------------------------------------------------------------------------

def _details(facts: Any) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": facts.architecture, "families": [facts.architecture],
            "parameter_size": facts.size_label, "quantization_level": facts.weight_type}


def _modified(facts: Any) -> str:
    moment = datetime.datetime.fromtimestamp(facts.modified_at, datetime.timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


@_in_ollama_shape
async def tags(request: HttpRequest) -> Response:
    """GET /api/tags: the models this server serves (one still loading by its name alone)."""
    return JSONResponse({"models": [_listed(model.name, model.runner) for model in request.app.state.server.models]})


def _listed(name: str, runner: Runner | None) -> dict[str, Any]:
    if runner is None:
        return {"name": name, "model": name}
    facts = runner.backend.facts
    return {"name": name, "model": name, "modified_at": _modified(facts), "size": facts.weight_bytes,
            "details": _details(facts)}


@_in_ollama_shape
async def running(request: HttpRequest) -> Response:
    """GET /api/ps: the models loaded now, and until when (they stay)."""
    loaded = []
    for model in request.app.state.server.models:
        runner = model.runner
        if runner is not None:
            on_gpu = runner.device is not None and not runner.device.startswith("CPU")
            loaded.append(_listed(model.name, runner) | {"expires_at": "9999-12-31T23:59:59Z",
                                                          "size_vram": runner.backend.facts.weight_bytes if on_gpu else 0,
                                                          "context_length": runner.window})
    return JSONResponse({"models": loaded})


@_in_ollama_shape
async def show(request: HttpRequest) -> Response:
    """POST /api/show: the model's details, template, capabilities."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, _ = await _picked(request, body.get("model") or body.get("name") or "")
    facts = runner.backend.facts
    info = {"general.architecture": facts.architecture, "general.parameter_count": facts.num_params}
    if facts.context_length:
        info[f"{facts.architecture}.context_length"] = facts.context_length
    return JSONResponse({"modelfile": "", "parameters": "", "template": runner.backend.chat_template_source or "",
                         "details": _details(facts), "model_info": info, "capabilities": _capabilities(runner),
                         "modified_at": _modified(facts)})


def _capabilities(runner) -> list[str]:
    backend = runner.backend
    if backend.ranks:
        return []
    if backend.embeds_whole:  # an encoder: it embeds, and writes nothing
        return ["embedding"]
    capabilities = ["completion", "tools"]
    if runner.tool_family.get("reasoning"):
        capabilities.append("thinking")
    if backend.modalities.get("vision"):
        capabilities.append("vision")
    return capabilities


async def version(request: HttpRequest) -> Response:
    return JSONResponse({"version": OLLAMA_VERSION})


ROUTES = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", running, methods=["GET"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/pull", _in_ollama_shape(pull), methods=["POST"]),
    Route("/api/delete", _in_ollama_shape(delete), methods=["DELETE"]),
]
