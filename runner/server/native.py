"""llama-server's native doors, for the editors and tools written against it (Continue's
llama.cpp provider, llama.vscode):

    POST /completion (and /completions)  {"prompt", "n_predict", "stream", "stop", "n_probs", ...}
        -> {"content", "stop": true, "stop_type", "stopping_word", "tokens_predicted",
            "tokens_evaluated", "tokens_cached", "completion_probabilities" (with n_probs), ...};
        streamed: a `data: {"content", "stop": false}` event per piece, then one with "stop": true;
        n_predict 0: the prompt computed (and cached) alone, as editors warm the cache;
        n_indent and t_max_predict_ms: an editor's limits (a line indented less, a new line
        after that long), reported as limits
    POST /infill  {"input_prefix", "input_suffix", "input_extra": [{"filename", "text"}], "prompt", ...}
        -> as /completion, with "prompt": the text laid out with the model's fill-in-the-middle
        tokens (multiseq.formats.infill), as llama-server lays it out
    POST /apply-template  {"messages"} -> {"prompt"}: the chat rendered, as the model would see it

A /completion body becomes a /v1/completions body (the same validation, queue and engine) and
its answer is written in llama-server's shape.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from ..errors import BackendError
from ..formats.fields import ItemError
from ..formats.reader import openai_body_item
from ..formats.tool_fields import TOOL_FIELDS
from ..formats.infill import FIELDS as INFILL_FIELDS
from ..formats.infill import InfillWindow, infill_input, infill_tokens
from ..request import FinishReason, Result
from ..tools import TextDelta
from .bodies import read_json
from .chat import start_completion
from .errors import INVALID_REQUEST, ApiError
from .sse import EventStream, sse

# The batch llama-server's infill layout fits the text around the cursor into (its default -b):
# the prefix keeps up to 3/4 of it, the suffix 1/4, and other files' chunks what the slot has
# left after it. A slot under twice that gives half to each (llama-server would leave the chunks
# no room at all: its -b is not tied to the context).
INFILL_BATCH = 2048


def infill_window(slot_window: int) -> InfillWindow:
    return InfillWindow(min(INFILL_BATCH, slot_window // 2), slot_window)

# llama-server's names of the sampling fields, and the /v1/completions names they go by here.
_RENAMED = {"n_predict": "max_tokens", "n_indent": "min_indent", "t_max_predict_ms": "newline_deadline_ms"}
_PASSED = ("prompt", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
           "repeat_penalty", "ignore_eos", "min_tokens", "logit_bias", "grammar", "json_schema", "stream", "model")
# llama-server's fields that change nothing here (its cache, slots and timing knobs).
# ("samplers" names llama-server's sampler order, and its "infill" sampler, which is not applied here.)
_IGNORED = {"cache_prompt", "id_slot", "t_max_prompt_ms", "samplers", "return_tokens", "n_keep", "n_cmpl", "typical_p",
            "dynamic_temperature", "mirostat", "dry_multiplier", "post_sampling_probs", "response_fields",
            "timings_per_token", "return_progress"}


def openai_body_of(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The /v1/completions body of a /completion body, and whether it asks for no output
    (n_predict 0: the prompt computed and cached, as editors do to warm the cache); a 400
    naming a field it cannot take."""
    unknown = sorted(set(body) - set(_PASSED) - set(_RENAMED) - _IGNORED - {"n_probs"})
    if unknown:
        raise ApiError(400, f"{unknown[0]!r} is not a /completion field this server knows", INVALID_REQUEST, unknown[0])
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required: the text (or token ids) to complete", INVALID_REQUEST, "prompt")
    converted = {name: body[name] for name in _PASSED if body.get(name) is not None}
    for native, name in _RENAMED.items():
        if body.get(native) is not None:
            converted[name] = body[native]
    if converted.get("max_tokens") == -1:  # llama-server's "until the end"
        del converted["max_tokens"]
    prompt_only = converted.get("max_tokens") == 0
    if prompt_only:  # one token is generated, and left out of the answer
        converted["max_tokens"] = 1
    n_probs = body.get("n_probs")
    if n_probs:
        converted["logprobs"] = n_probs
    return converted, prompt_only


async def completion(request: HttpRequest) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    return await _answer(request, body, "completion")


async def infill(request: HttpRequest) -> Response:
    """llama-server's /infill: the text around the cursor (and chunks of other files) laid out
    with the model's fill-in-the-middle tokens, then completed as /completion completes."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, _ = await state.runner_for(body.get("model"))
    tokens, text = await infill_prompt(request, runner, body, "/infill needs the model's fill-in-the-middle tokens; "
                                                              "this model has no {tokens} token (use /completion)")
    fields = {name: value for name, value in body.items() if name not in INFILL_FIELDS}
    return await _answer(request, fields | {"prompt": tokens}, "infill", prompt_text=text)


async def infill_prompt(request: HttpRequest, runner, body: dict[str, Any], missing: str,
                        param: str | None = None) -> tuple[list[int], str]:
    """The body's infill fields (the text before and after the cursor, other files' chunks)
    laid out with the model's fill-in-the-middle tokens: the prompt's tokens and text. A 400
    saying `missing` ({tokens}: the ones the model lacks; naming `param`) when it has none, or
    naming the field that is wrong."""
    fim = runner.backend.fim_tokens()
    if fim.missing:
        raise ApiError(400, missing.format(tokens=", ".join(fim.missing)), INVALID_REQUEST, param)
    try:
        wanted = infill_input(body)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    return await request.app.state.server.offload.prepare(_infill_tokens, runner.backend, wanted, fim,
                                                          infill_window(runner.window))


def _infill_tokens(backend, wanted, fim, window: InfillWindow) -> tuple[list[int], str]:
    """The laid-out prompt's tokens and their text (off the event loop: both take a while)."""
    bos = backend.bos_token if backend.add_bos else None
    tokens = infill_tokens(wanted, fim, lambda text: backend.tokenize(text, False, False),
                           backend.tokenize(wanted.prompt, False, True), window, bos)
    return tokens, backend.render_tokens(tokens)


async def _answer(request: HttpRequest, body: dict[str, Any], api: str, prompt_text: str | None = None) -> Response:
    """A /completion-shaped answer (whole, or streamed as llama-server streams)."""
    converted, prompt_only = openai_body_of(body)
    call = await start_completion(request, converted, False, api)
    model = call.model
    if converted.get("stream"):
        return EventStream(_events(call, model, prompt_only), on_disconnect=call.cancel)
    results = await call.results(request)
    if results is None:  # the client went away: its request was cancelled
        return Response(status_code=499)
    answer = final_body(results[0], model, prompt_only)
    if prompt_text is not None:
        answer["prompt"] = prompt_text
    if body.get("n_probs") and not prompt_only:
        answer["completion_probabilities"] = completion_probabilities(results[0])
    return JSONResponse(answer)


async def _events(call, model: str, prompt_only: bool) -> AsyncIterator[str]:
    """llama-server's stream: the text piece by piece, then the end with the counts."""
    async for event in call.events():
        if isinstance(event, TextDelta) and event.text and not prompt_only:
            yield sse({"index": 0, "content": event.text, "tokens": [], "stop": False, "id_slot": -1})
        elif isinstance(event, ApiError):
            yield sse(event.body())
            return
        elif isinstance(event, Result):
            yield sse({"index": 0, "content": "", "tokens": [], "stop": True, "id_slot": -1, "model": model,
                       **_stop_fields(event.finish_reason.value, event.stop_string),
                       "tokens_predicted": 0 if prompt_only else event.completion_tokens,
                       "tokens_evaluated": event.prompt_tokens, "tokens_cached": event.prompt_tokens_cached})


def final_body(result: Result, model: str, prompt_only: bool = False) -> dict[str, Any]:
    """A whole /completion answer, in llama-server's fields (prompt_only: no output asked for)."""
    text = "" if prompt_only else result.text
    return {"index": 0, "content": text, "tokens": [], "id_slot": -1, "stop": True, "model": model,
            "tokens_predicted": 0 if prompt_only else result.completion_tokens, "tokens_evaluated": result.prompt_tokens,
            "has_new_line": "\n" in text, "truncated": result.truncated,
            **_stop_fields(result.finish_reason.value, result.stop_string),
            "tokens_cached": result.prompt_tokens_cached,
            "timings": {"prompt_n": result.prompt_tokens - result.prompt_tokens_cached,
                        "predicted_n": 0 if prompt_only else result.completion_tokens}}


def _stop_fields(finish_reason: str, stop_string: str | None) -> dict[str, Any]:
    if finish_reason == FinishReason.LENGTH.value:
        return {"stop_type": "limit", "stopping_word": ""}
    if stop_string is not None:
        return {"stop_type": "word", "stopping_word": stop_string}
    return {"stop_type": "eos", "stopping_word": ""}


def completion_probabilities(result: Result) -> list[dict[str, Any]]:
    """Each output token with its log probability and the most likely alternatives (n_probs)."""
    def entry(token_id: int, token_bytes: bytes, logprob: float) -> dict[str, Any]:
        return {"id": token_id, "token": token_bytes.decode("utf-8", "replace"), "bytes": list(token_bytes),
                "logprob": logprob}

    return [entry(item.token_id, item.token_bytes, item.logprob)
            | {"top_logprobs": [entry(top.token_id, top.token_bytes, top.logprob) for top in item.top_logprobs]}
            for item in result.logprobs or ()]


async def apply_template(request: HttpRequest) -> Response:
    """The prompt a chat renders to in the model's template (with the assistant's turn opened):
    the messages, tools and template switches of a Chat Completions body, rendered as the chat
    itself would be (its other fields are not read)."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    runner, _ = await state.runner_for(body.get("model"))
    rendered = {name: value for name, value in body.items() if name == "messages" or name in TOOL_FIELDS}
    try:
        item = await state.offload.prepare(openai_body_item, uuid.uuid4().hex, rendered, True, state.settings.defaults)
        prompt = await state.offload.prepare(runner.prompt_text, item.request)
    except ItemError as error:
        raise ApiError(400, str(error), INVALID_REQUEST, error.param) from None
    except (ValueError, BackendError) as error:
        raise ApiError(400, f"'messages': {error}", INVALID_REQUEST, "messages") from None
    return JSONResponse({"prompt": prompt})
