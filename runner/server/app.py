"""The OpenAI-compatible HTTP app: create_app(runner) builds it, starting nothing.

Routes: POST /v1/chat/completions and /v1/completions (streamed as server-sent events, or
not), llama-server's native /completion, /infill and /apply-template (native.py), POST
/v1/embeddings and llama-server's /embedding (embeddings.py), a reranker's /v1/rerank and
/rerank (rerank.py), GET /v1/models,
GET /health (503 while the model loads, 200 when ready), GET /metrics, the server's page at
GET / with the state it draws at GET /status (page.py),
and with a data directory the Files and Batch APIs (batch_api.py). A request body becomes
engine requests through multiseq.formats, the same translation batch-run applies to OpenAI
Batch lines, and results become response bodies the same way. Interactive requests run at
Priority.INTERACTIVE, above the Batch API's lines.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..loop.runner import Runner
from . import batch_api, embeddings, messages, native, ollama, page, rerank, responses, slots, tokens
from .chat import chat_completions, completions
from .door import HEALTH_PATHS, ApiKeyGuard, SiteGuard, cors_options
from .errors import INVALID_REQUEST, NOT_FOUND, SERVER_ERROR, ApiError, internal_error
from .bodies import read_json
from .models import ServedModel, ready
from .monitor import WatchRequests
from .state import (CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, DEFAULT_MAX_BATCH_LINES, DEFAULT_MAX_BODY_BYTES,  # noqa: F401
                    DEFAULT_MAX_QUEUE,
                    DEFAULT_MAX_UPLOAD_BYTES, RETRY_AFTER_SECONDS, ServerSettings, ServerState)

logger = logging.getLogger("multiseq.server")

def state_of(request: HttpRequest) -> ServerState:
    return request.app.state.server


# --- the routes ---------------------------------------------------------------------------------

async def health(request: HttpRequest) -> Response:
    state = state_of(request)
    if state.is_draining:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    default = state.models.default
    if default.failure is not None:
        return JSONResponse({"status": "failed", "reason": default.failure}, status_code=503)
    if default.runner is None:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    stopped = next((model.runner.failure for model in state.models
                    if model.runner is not None and model.runner.failure is not None), None)
    if stopped is not None:  # `multiseq serve` exits once its streams have ended
        return JSONResponse({"status": "failed", "reason": stopped}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(request: HttpRequest) -> Response:
    state_of(request).metrics.loop_lag.start()  # an app served by other means watches from its first scrape
    return Response(generate_latest(state_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _model_card(model: ServedModel) -> dict[str, Any]:
    """A served model as /v1/models lists it, with its state as llama-server's router says it."""
    card = {"id": model.name, "object": "model", "created": 0, "owned_by": "multiseq",
            "aliases": list(model.aliases), "status": {"value": model.status}}
    if model.runner is not None and any(_modalities(model.runner).values()):
        card["capabilities"] = ["completion", "multimodal"]  # as llama-server lists a model that reads media
    return card


def _modalities(runner) -> dict[str, bool]:
    """What the model reads besides text, as llama-server's /props says it."""
    return runner.backend.modalities


async def props(request: HttpRequest) -> Response:
    """What the served model is read as (llama-server's /props, in part): its tool-call and
    reasoning family, and the slots."""
    model = state_of(request).models.pick(request.query_params.get("model"))  # llama-server's router: ?model=
    runner = model.runner
    if runner is None:
        raise ApiError(503, "The model is still loading.", SERVER_ERROR)
    return JSONResponse({"model": model.name, "tool_format": runner.tool_family,
                         "total_slots": runner.config.parallel, "slot_ctx": runner.window,
                         "modalities": _modalities(runner),
                         "embedding": {"pooling": runner.pooling, "n_embd": runner.backend.n_embd}})


async def lora_adapters(request: HttpRequest) -> Response:
    """GET /lora-adapters, llama-server's: the model's adapters (--lora, --lora-scaled, then
    --lora-modules with their names), each with its id and scale (?model= picks one of several
    models); a request's `lora` field names them by id. Their scales are set at start: a POST
    is a 400 saying so."""
    model = state_of(request).models.pick(request.query_params.get("model"))
    if request.method == "POST":
        raise ApiError(400, "The adapters' scales are set when the server starts (--lora, --lora-scaled); they "
                            "cannot be changed while it serves.", INVALID_REQUEST)
    config = ready(model).config  # the whole model's adapters, then those of --lora-modules (by name)
    listed = [{"path": str(path), "scale": float(scale)} for path, scale in config.lora] + [
        {"name": name, "path": str(path), "scale": float(scale)} for name, path, scale in config.lora_modules]
    return JSONResponse([{"id": index} | entry for index, entry in enumerate(listed)])


async def list_models(request: HttpRequest) -> Response:
    cards = [card for model in state_of(request).models for card in (_model_card(model), *(
        _model_card(model) | {"id": name, "aliases": [], "parent": model.name} for name in model.adapters))]
    return JSONResponse({"object": "list", "data": cards, "models": cards})  # Codex reads `models`


async def get_model(request: HttpRequest) -> Response:
    return JSONResponse(_model_card(state_of(request).models.pick(request.path_params["model"])))


async def load_model(request: HttpRequest) -> Response:
    """POST /models/load, llama-server's router's: {"model"} loaded (now, or already)."""
    state = state_of(request)
    model = state.models.pick((await read_json(request, state.settings.max_body_bytes)).get("model"))
    if state.loader is not None:
        await state.loader.ensure_loaded(model)
    ready(model)  # a 503 saying why it cannot serve
    return JSONResponse({"success": True})


async def unload_model(request: HttpRequest) -> Response:
    """POST /models/unload, llama-server's router's: {"model"} unloaded now (what runs on it is
    cancelled); the default model stays loaded."""
    state = state_of(request)
    model = state.models.pick((await read_json(request, state.settings.max_body_bytes)).get("model"))
    if model is state.models.default or state.loader is None or model.config is None:
        raise ApiError(400, f"The model {model.name!r} stays loaded: it is the server's default, or was not loaded "
                            f"by it.", INVALID_REQUEST, "model")
    await state.loader.unload(model)
    return JSONResponse({"success": True})


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


def create_app(runner: Runner | None = None, settings: ServerSettings | None = None) -> Starlette:
    """The ASGI app over `runner` (None: not loaded yet; attach it later with
    app.state.server.attach(runner), /health answering 503 until then). Nothing is started:
    serve it with uvicorn, or mount it in an app of your own. With settings.data_dir, its
    database is opened here (StoreError when the folder cannot be used); call
    app.state.server.close() once the server has stopped."""
    settings = settings or ServerSettings()
    routes = [
        *(Route(path, health, methods=["GET"]) for path in HEALTH_PATHS),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/lora-adapters", lora_adapters, methods=["GET", "POST"]),
        Route("/slots", slots.list_slots, methods=["GET"]),
        Route("/slots/{id_slot}", slots.slot_action, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/models", list_models, methods=["GET"]),  # llama-server's alias
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/models/load", load_model, methods=["POST"]),
        Route("/models/unload", unload_model, methods=["POST"]),
        Route(CHAT_ENDPOINT, chat_completions, methods=["POST"]),
        # llama-server's alias: clients given the server's root as their OpenAI base URL post here
        # (Continue's llama.cpp provider does).
        Route(CHAT_ENDPOINT.removeprefix("/v1"), chat_completions, methods=["POST"]),
        Route(COMPLETIONS_ENDPOINT, completions, methods=["POST"]),
        Route(messages.ENDPOINT, messages.create_message, methods=["POST"]),
        Route(f"{messages.ENDPOINT}/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/tokenize", tokens.tokenize, methods=["POST"]),
        Route("/detokenize", tokens.detokenize, methods=["POST"]),
        Route("/tokenizer_info", tokens.tokenizer_info, methods=["GET"]),
        Route("/completion", native.completion, methods=["POST"]),
        Route("/completions", native.completion, methods=["POST"]),
        Route("/apply-template", native.apply_template, methods=["POST"]),
        Route("/infill", native.infill, methods=["POST"]),
        Route("/v1/embeddings", embeddings.create_embeddings, methods=["POST"]),
        Route("/embeddings", embeddings.create_embeddings, methods=["POST"]),
        Route("/embedding", embeddings.native_embedding, methods=["POST"]),
        *(Route(path, rerank.rerank, methods=["POST"]) for path in rerank.PATHS),
        *batch_api.ROUTES,
        *responses.ROUTES,
        *ollama.ROUTES,
        *page.routes(settings.webui),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected_error})
    app.state.server = ServerState(runner, settings)
    # Added innermost first: the Host and Origin checks run before anything else, CORS answers
    # a preflight before the key is asked for (browsers send none with it).
    app.add_middleware(ApiKeyGuard, api_key=settings.api_key, metrics_public=settings.metrics_public,
                       page_paths=page.PAGE_PATHS if settings.webui else ())
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, **cors_options(settings.cors_origins))
    app.add_middleware(SiteGuard, allowed_hosts=settings.allowed_hosts, cors_origins=settings.cors_origins)
    # Outermost: it sees every refusal too.
    app.add_middleware(WatchRequests, monitor=app.state.server.monitor, probe_paths=HEALTH_PATHS)
    return app

