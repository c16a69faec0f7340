"""Rerank requests in and out, in the shapes llama-server answers on /rerank and /v1/rerank:

    Jina / Cohere: {"query", "documents": ["text" | {"text"}, ...], "top_n"?, "return_documents"?, "model"?}
      -> {"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
          "results": [{"index", "relevance_score", "document"?: {"text"}}, ...]}
    TEI (text-embeddings-inference): {"query", "texts": [...], "return_text"?, "raw_scores"?, "truncate"?}
      -> [{"index", "score", "text"?}, ...]

Results are sorted by score, highest first, and cut to top_n. A score is the reranker's first
output as llama.cpp computes it (what llama-server returns): a cross-encoder's logit, a
Qwen3-Reranker's probability of "yes".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import is_int
from ..request import Result
from .fields import ItemError

# Fields a client may send that change nothing here (the model is the server's; a TEI client's
# truncation and score options have llama-server's meaning: none).
_IGNORED = {"model", "user", "raw_scores", "truncate", "truncation_direction", "max_chunks_per_doc",
            "rank_fields", "max_tokens_per_doc", "return_len"}
_FIELDS = {"query", "documents", "texts", "top_n", "return_documents", "return_text", *_IGNORED}


@dataclass(frozen=True)
class RerankQuery:
    """A parsed rerank body: the query, its documents, and how the answer is shaped."""

    query: str
    documents: tuple[str, ...]
    top_n: int
    return_documents: bool
    tei: bool  # TEI's shape ("texts" in, a bare list out) rather than Jina's and Cohere's


def rerank_query(body: Any) -> RerankQuery:
    """The body's query and documents; an ItemError naming the field that is wrong."""
    if not isinstance(body, dict):
        raise ItemError("the request body must be a JSON object", "body")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ItemError(f"{unknown[0]!r} is not a rerank field", unknown[0])
    query = body.get("query")
    if not isinstance(query, str):
        raise ItemError("'query' must be a string", "query")
    tei = "texts" in body and "documents" not in body
    field = "texts" if tei else "documents"
    documents = _documents(body.get(field), field)
    top_n = body.get("top_n", len(documents))
    if not is_int(top_n) or top_n < 1:
        raise ItemError("'top_n' must be an integer >= 1", "top_n")
    flag = "return_text" if tei else "return_documents"
    return_documents = body.get(flag, False)
    if not isinstance(return_documents, bool):
        raise ItemError(f"'{flag}' must be true or false", flag)
    return RerankQuery(query, documents, top_n, return_documents, tei)


def _documents(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ItemError(f"'{field}' must be a non-empty list of strings", field)
    documents = []
    for index, document in enumerate(value):
        if isinstance(document, dict) and isinstance(document.get("text"), str):
            document = document["text"]  # Jina's and Cohere's {"text": ...}
        if not isinstance(document, str):
            raise ItemError(f"'{field}[{index}]' must be a string (or an object with a string 'text')",
                            f"{field}[{index}]")
        documents.append(document)
    return tuple(documents)


def rerank_body(query: RerankQuery, results: list[Result], model: str) -> Any:
    """The answer: each document's score, highest first, top_n of them."""
    score_name = "score" if query.tei else "relevance_score"
    ranked = []
    for index, result in enumerate(results):
        entry = {"index": index, score_name: float(result.embedding[0])}
        if query.return_documents:
            entry["text" if query.tei else "document"] = (query.documents[index] if query.tei
                                                          else {"text": query.documents[index]})
        ranked.append(entry)
    ranked.sort(key=lambda entry: entry[score_name], reverse=True)
    ranked = ranked[:query.top_n]
    if query.tei:
        return ranked
    tokens = sum(result.prompt_tokens for result in results)
    return {"model": model, "object": "list", "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": ranked}
