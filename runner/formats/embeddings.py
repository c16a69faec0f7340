"""Embedding requests in and out, in OpenAI's shape (/v1/embeddings, Batch lines whose url is
/v1/embeddings) and llama-server's (/embedding):

    {"input": "text" | ["text", ...] | [token ids] | [[token ids], ...], "encoding_format"?,
     "dimensions"?, "model"?, "user"?}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}

Every input is its own request in the batch (runner.Request with `embed`, the pooling). Vectors
are normalized as llama-server normalizes them (embd_normalize: 2, Euclidean, by default);
with pooling none, every token's row comes back as it is, as llama-server gives it.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ..request import Request, Result
from ..config import DEFAULT_POOLING, is_int
from .fields import ItemError

ENCODINGS = ("float", "base64")
_FIELDS = {"input", "model", "encoding_format", "dimensions", "user"}
# llama-server's /embedding fields: its "content" is OpenAI's "input".
NATIVE_FIELDS = {"input", "content", "model", "embd_normalize", "encoding_format"}
EUCLIDEAN = 2  # llama-server's default embd_normalize


def embedding_inputs(value: Any, field: str = "input") -> list[str | tuple[int, ...]]:
    """The inputs of a body: a string, token ids, or a list of either, each one input; an
    ItemError naming the input that is not."""
    single = isinstance(value, str) or (isinstance(value, list) and value and all(is_int(item) for item in value))
    if single:
        value = [value]
    if not isinstance(value, list) or not value:
        raise ItemError(f"'{field}' must be a string, a list of token ids, or a non-empty list of either", field)
    inputs = []
    for index, item in enumerate(value):
        name = field if single else f"{field}[{index}]"
        if isinstance(item, str):
            if not item:
                raise ItemError(f"'{name}' is empty: there is nothing to embed", name)
            inputs.append(item)
        elif isinstance(item, list) and item and all(is_int(token) and token >= 0 for token in item):
            inputs.append(tuple(item))
        else:
            raise ItemError(f"'{name}' must be a non-empty string or a non-empty list of token ids", name)
    return inputs


def embeddings_body_requests(item_id: str, body: Any, pooling: str = DEFAULT_POOLING,
                             width: int | None = None) -> tuple[Request, ...]:
    """The requests of one /v1/embeddings body (a Batch line's, or the server's, which knows
    its pooling and the vectors' width and checks them here); ItemError naming the field."""
    if not isinstance(body, dict):
        raise ItemError("the request body must be a JSON object", "body")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ItemError(f"{unknown[0]!r} is not an embeddings field", unknown[0])
    encoding_format(body)
    dimensions = body.get("dimensions")
    if dimensions is not None and not (is_int(dimensions) and dimensions > 0):
        raise ItemError(f"'dimensions' must be an integer > 0, got {dimensions!r}", "dimensions")
    if dimensions is not None and width is not None and dimensions != width:
        raise ItemError(dimensions_error(width), "dimensions")
    if pooling == "none":
        raise ItemError(POOLED_NONE_ERROR, "input")
    return input_requests(item_id, embedding_inputs(body.get("input")), pooling)


def input_requests(item_id: str, inputs: list[str | tuple[int, ...]],
                   pooling: str = DEFAULT_POOLING) -> tuple[Request, ...]:
    """A request per input (its id the item's, with #index when there are several)."""
    return tuple(Request(prompt=text, embed=pooling, id=f"{item_id}#{index}" if len(inputs) > 1 else item_id)
                 for index, text in enumerate(inputs))


def dimensions_error(width: int) -> str:
    return (f"'dimensions' cannot be honoured: this model's embeddings have {width} dimensions, and it was not "
            f"trained to shorten them")


POOLED_NONE_ERROR = ("this server pools no embeddings (--pooling none), and OpenAI's shape has one vector per input: "
                     "use /embedding, or serve with another --pooling")


def encoding_format(body: dict[str, Any]) -> str:
    value = body.get("encoding_format") or "float"
    if value not in ENCODINGS:
        raise ItemError(f"'encoding_format' must be float or base64, got {value!r}", "encoding_format")
    return value


def normalized(vector: np.ndarray, norm: int = EUCLIDEAN) -> np.ndarray:
    """llama-server's common_embd_normalize: -1 none, 0 scaled to int16's range by the largest
    magnitude, 1 taxicab, 2 Euclidean, p > 2 the p-norm."""
    values = vector.astype(np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = np.abs(values).max() / 32760.0
    elif norm == 2:
        total = np.sqrt((values * values).sum())
    else:
        total = (np.abs(values) ** norm).sum() ** (1.0 / norm)
    return (values * (1.0 / total if total > 0 else 0.0)).astype(np.float32)


def embeddings_body(results: list[Result], model: str, encoding: str = "float") -> dict[str, Any]:
    """OpenAI's answer to an embeddings body: a normalized vector per input, in input order."""
    data = [{"object": "embedding", "index": index, "embedding": _encoded(normalized(result.embedding), encoding)}
            for index, result in enumerate(results)]
    tokens = sum(result.prompt_tokens for result in results)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def embedding_values(embedding: np.ndarray, norm: int = EUCLIDEAN) -> list:
    """A pooled vector normalized, or (pooling none) every token's row as it is."""
    return normalized(embedding, norm).tolist() if embedding.ndim == 1 else embedding.tolist()


def native_embeddings_body(results: list[Result], norm: int = EUCLIDEAN) -> list[dict[str, Any]]:
    """llama-server's /embedding answer: per input, its pooled vector normalized (as a list of
    one), or with pooling none every token's row as it is."""
    def rows(embedding: np.ndarray) -> list:
        values = embedding_values(embedding, norm)
        return [values] if embedding.ndim == 1 else values

    return [{"index": index, "embedding": rows(result.embedding)} for index, result in enumerate(results)]


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's and llama-server's
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
