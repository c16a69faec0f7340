"""POST /tokenize and POST /detokenize, in llama-server's shapes and in vLLM's, and vLLM's
GET /tokenizer_info, for clients and tools that count or inspect the served model's tokens
(lm-evaluation-harness tokenizes through them with `tokenizer_backend=remote`).

    POST /tokenize    llama-server: {"content": str, "add_special": bool (false), "with_pieces": bool}
                      -> {"tokens": [id, ...]}, or with_pieces: {"tokens": [{"id", "piece"}, ...]}
                      vLLM: {"prompt": str, "add_special_tokens": bool (true), "return_token_strs": bool}
                      -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"tokens": [id, ...]} -> {"content": str, "prompt": str} (both shapes' names)
    GET /tokenizer_info -> {"eos_token", "bos_token", "chat_template", "model_max_length", ...}

A piece is the token's text, or, when its bytes are not whole UTF-8 characters (a character
split across tokens), the list of its byte values, as llama-server gives it. Tokenizing a long
text takes a while, so both run off the event loop.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from .bodies import read_json
from .errors import ApiError

DEFAULT_ADD_SPECIAL = False  # llama-server's default: no BOS unless asked for


async def tokenize(request: HttpRequest) -> Response:
    """The tokens of `content` (with their pieces when `with_pieces`), or of vLLM's `prompt`."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, _ = await state.runner_for(body.get("model"))
    if "prompt" in body:
        return await _tokenize_as_vllm(request, runner, body)
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "'content' must be the text to tokenize (a string)", param="content")
    add_special = _flag(body, "add_special", DEFAULT_ADD_SPECIAL)
    with_pieces = _flag(body, "with_pieces", False)
    tokens = await state.offload.prepare(runner.backend.tokenize, content, add_special)
    if not with_pieces:
        return JSONResponse({"tokens": tokens})
    backend = runner.backend
    return JSONResponse({"tokens": [{"id": token, "piece": piece_of(backend.token_bytes(token))}
                                    for token in tokens]})


async def _tokenize_as_vllm(request: HttpRequest, runner, body: dict[str, Any]) -> Response:
    if "content" in body:
        raise ApiError(400, "give the text as 'prompt' (vLLM's name) or as 'content' (llama-server's), not both",
                       param="prompt")
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be the text to tokenize (a string)", param="prompt")
    add_special = _flag(body, "add_special_tokens", True)  # vLLM's default, unlike llama-server's
    tokens = await request.app.state.server.offload.prepare(runner.backend.tokenize, prompt, add_special)
    token_strs = None
    if _flag(body, "return_token_strs", False):
        token_strs = [runner.backend.token_bytes(token).decode("utf-8", "replace") for token in tokens]
    return JSONResponse({"count": len(tokens), "max_model_len": runner.window, "tokens": tokens,
                         "token_strs": token_strs})


async def tokenizer_info(request: HttpRequest) -> Response:
    """The tokenizer's description in vLLM's shape: what a remote client needs to tokenize
    through /tokenize and to render chats itself (its special tokens' texts, the template)."""
    state = request.app.state.server
    runner, _ = await state.runner_for(request.query_params.get("model"))
    backend = runner.backend
    bos, eos = backend.bos_and_eos_texts()
    return JSONResponse({"tokenizer_class": "llama.cpp", "bos_token": bos or None, "eos_token": eos or None,
                         "pad_token": None, "add_bos_token": backend.add_bos, "vocab_size": backend.n_vocab,
                         "model_max_length": runner.window, "chat_template": backend.chat_template_source})


async def detokenize(request: HttpRequest) -> Response:
    """The text of `tokens`; a 400 naming the first id outside the vocabulary."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, _ = await state.runner_for(body.get("model"))
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(token, int) and not isinstance(token, bool)
                                               for token in tokens):
        raise ApiError(400, "'tokens' must be a list of token ids (integers)", param="tokens")
    try:
        content = await state.offload.prepare(_text_of, runner.backend, tokens)
    except ValueError as error:
        raise ApiError(400, f"'tokens': {error}", param="tokens") from None
    return JSONResponse({"content": content, "prompt": content})


def piece_of(piece: bytes) -> str | list[int]:
    """A token's piece as llama-server writes it: text, or its byte values when they are not
    whole UTF-8 characters."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {json.dumps(value)}", param=name)
    return value


def _text_of(backend, tokens: list[int]) -> str:
    """The text of tokens (special tokens render as nothing); ValueError for an id outside the
    vocabulary (off the event loop: long lists take a while)."""
    outside = next((token for token in tokens if not 0 <= token < backend.n_vocab), None)
    if outside is not None:
        raise ValueError(f"token {outside} is not in the vocabulary (0 to {backend.n_vocab - 1})")
    return b"".join(backend.token_bytes(token) for token in tokens).decode("utf-8", "replace")
