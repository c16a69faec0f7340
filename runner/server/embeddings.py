"""The embedding doors: OpenAI's POST /v1/embeddings (and /embeddings), llama-server's native
POST /embedding (its "content", embd_normalize, and with --pooling none a row per token).

Every input is a request of its own in the engine's batch, beside whatever else runs (runner.
loop.pooling pools its rows). Inputs are tokenized and checked in the prepare threads before any
is queued: an empty one, a token id outside the vocabulary, or one longer than a slot's window
is a 400 naming it, and nothing of the request runs.
"""

from __future__ import annotations

import dataclasses
import uuid

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from ..config import RANK, is_int
from ..formats.embeddings import (EUCLIDEAN, NATIVE_FIELDS, embedding_inputs, embeddings_body, embeddings_body_requests,
                                  encoding_format, input_requests, native_embeddings_body)
from ..formats.fields import ItemError
from ..formats.reader import PromptItem, embeddings_item
from ..request import Priority
from .bodies import read_json
from .chat import CompletionCall
from .errors import INVALID_REQUEST, ApiError


async def create_embeddings(request: HttpRequest) -> Response:
    """OpenAI's embeddings: a normalized vector per input."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, model = await state.runner_for(body.get("model"))
    item_id = uuid.uuid4().hex
    try:
        requests = embeddings_body_requests(item_id, body, runner.pooling, runner.backend.n_embd)
        encoding = encoding_format(body)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    results = await embedded(request, runner, embeddings_item(item_id, requests, encoding), "input")
    if results is None:
        return Response(status_code=499)
    return JSONResponse(embeddings_body(results, model, encoding))


async def native_embedding(request: HttpRequest) -> Response:
    """llama-server's /embedding: per input, its pooled vector (normalized by embd_normalize)
    as a list of one, or with pooling none every token's row."""
    state = request.app.state.server
    state.ready_runner()  # a 503 while the model loads, before the body is read
    body = await read_json(request, state.settings.max_body_bytes)
    runner, model = await state.runner_for(body.get("model"))
    field = "input" if "input" in body else "content"
    try:
        unknown = sorted(set(body) - NATIVE_FIELDS)
        if unknown:
            raise ItemError(f"{unknown[0]!r} is not an /embedding field", unknown[0])
        norm = body.get("embd_normalize", EUCLIDEAN)
        if not is_int(norm) or norm < -1:
            raise ItemError("'embd_normalize' must be an integer >= -1 (-1 none, 0 int16 range, 1 taxicab, "
                            "2 Euclidean, p > 2 the p-norm)", "embd_normalize")
        item_id = uuid.uuid4().hex
        item = embeddings_item(item_id, input_requests(item_id, embedding_inputs(body.get(field), field)))
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    results = await embedded(request, runner, item, field)
    if results is None:
        return Response(status_code=499)
    return JSONResponse(native_embeddings_body(results, norm))


async def embedded(request: HttpRequest, runner, item: PromptItem, field: str):
    """Run every input of the item on `runner` at interactive priority: its results in input
    order (None when the client went away first)."""
    state = request.app.state.server
    if runner.pooling == RANK:
        raise ApiError(400, "The served model is a reranker (pooling rank): it scores documents through /v1/rerank; "
                       "start the server with --pooling mean, cls or last for embeddings.", INVALID_REQUEST)
    requests = item.prompt_requests or (item.request,)
    try:
        tokens = await state.offload.prepare(_checked_tokens, runner, [request.prompt for request in requests], field)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    requests = tuple(dataclasses.replace(request, prompt=tuple(ids), priority=Priority.INTERACTIVE)
                     for request, ids in zip(requests, tokens))
    item = dataclasses.replace(item, request=requests[0], prompt_requests=requests if len(requests) > 1 else ())
    state.metrics.requests.labels("embeddings").inc()
    state.metrics.embedding_inputs.inc(len(requests))
    state.metrics.embedding_tokens.inc(sum(map(len, tokens)))
    return await CompletionCall(state, await state.submit(runner, item, streams=False), "").results(request)


def _checked_tokens(runner, inputs: list, field: str) -> list[list[int]]:
    """Every input's tokens; an ItemError naming each that cannot be embedded (off the event
    loop: long texts take a while to tokenize)."""
    backend, window = runner.backend, input_limit(runner)
    tokens, problems = [], []
    for index, value in enumerate(inputs):
        ids = backend.tokenize(value) if isinstance(value, str) else list(value)
        outside = next((token for token in ids if token >= backend.n_vocab), None)
        name = f"{field}[{index}]" if len(inputs) > 1 else field
        if outside is not None:
            problems.append((name, f"token {outside} is not in the vocabulary (0 to {backend.n_vocab - 1})"))
        elif not ids:
            problems.append((name, "it tokenizes to no tokens"))
        elif len(ids) > window:
            problems.append((name, f"it has {len(ids)} tokens, more than a slot's {window}-token window"))
        tokens.append(ids)
    if problems:
        raise refusal(problems, "nothing was embedded")
    return tokens


def input_limit(runner) -> int:
    """The most tokens one input may have: a slot's window, and for an input computed whole in
    one decode (a BERT's, a reranker's pair) a decode's batch too."""
    backend = runner.backend
    return min(runner.window, backend.n_batch) if backend.embeds_whole else runner.window


def refusal(problems: list[tuple[str, str]], outcome: str) -> ItemError:
    """One error naming every bad input (name, why), the first as the parameter."""
    return ItemError("; ".join(f"'{name}': {why}" for name, why in problems) + f" ({outcome})", problems[0][0])
