"""The rerank doors llama-server has: POST /rerank, /reranking, /v1/rerank and /v1/reranking, in
Jina's and Cohere's shape or TEI's (multiseq.formats.rerank), for a reranker: a model served
with pooling rank (its GGUF says so, or --pooling rank).

Every document is a request of its own in the engine's batch, beside whatever else runs: the
query and the document laid out as llama-server lays them out (multiseq.llama.rerank), scored
whole by llama.cpp with the model's classifier head. The pairs are tokenized and checked in the
prepare pool before any is queued: a pair longer than a slot's window or a decode's batch is a
400 naming its document, and nothing of the request runs.
"""

from __future__ import annotations

import uuid

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from ..config import RANK
from ..formats.fields import ItemError
from ..formats.reader import embeddings_item
from ..formats.rerank import RerankQuery, rerank_body, rerank_query
from ..request import Priority, Request
from .bodies import read_json
from .chat import CompletionCall
from .embeddings import input_limit, refusal
from .errors import INVALID_REQUEST, ApiError

NOT_SUPPORTED = "not_supported_error"
PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v2/rerank")  # /v2/rerank: Cohere's v2 client


async def rerank(request: HttpRequest) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, model = await state.runner_for(body.get("model", _first_reranker(state)))
    if runner.pooling != RANK:
        raise ApiError(501, f"The model {model!r} is not a reranker: serve a reranker's GGUF (it says pooling rank), "
                       "or start the server with --pooling rank on a model with a classifier head.", NOT_SUPPORTED)
    try:
        query = rerank_query(body)
        pairs = await state.offload.prepare(_checked_pairs, runner, query)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    item_id = uuid.uuid4().hex
    requests = tuple(Request(prompt=tuple(tokens), embed=RANK, priority=Priority.INTERACTIVE, id=f"{item_id}#{index}")
                     for index, tokens in enumerate(pairs))
    state.metrics.requests.labels("rerank").inc()
    state.metrics.embedding_inputs.inc(len(requests))
    state.metrics.embedding_tokens.inc(sum(map(len, pairs)))
    job = await state.submit(runner, embeddings_item(item_id, requests), streams=False)
    results = await CompletionCall(state, job, model).results(request)
    if results is None:
        return Response(status_code=499)
    return JSONResponse(rerank_body(query, results, model))


def _first_reranker(state) -> str | None:
    """The model a rerank that names none goes to: the first loaded reranker (None: the default)."""
    return next((model.name for model in state.models if model.runner is not None and model.runner.pooling == RANK),
                None)


def _checked_pairs(runner, query: RerankQuery) -> list[list[int]]:
    """Every document's input (the query beside it); an ItemError naming each that is too long
    (off the event loop: long documents take a while to tokenize)."""
    backend, limit = runner.backend, input_limit(runner)  # (a reranker computes every pair whole)
    field = "texts" if query.tei else "documents"
    pairs, problems = [], []
    for index, document in enumerate(query.documents):
        tokens = backend.rerank_tokens(query.query, document)
        if len(tokens) > limit:
            problems.append((f"{field}[{index}]", f"with the query it has {len(tokens)} tokens, more than the "
                                                  f"{limit} a reranker scores at once (the slot window and -b/--batch-size)"))
        pairs.append(tokens)
    if problems:
        raise refusal(problems, "nothing was ranked")
    return pairs
