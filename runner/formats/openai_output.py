"""OpenAI Batch API output lines, shaped as OpenAI writes them.

- A line that ran: `response.status_code` 200 and a chat.completion or text_completion body
  with one choice per `n`, finish_reason `stop` or `length`, logprobs when asked.
- A line rejected for its content (a bad field, a field that cannot be honoured, a prompt
  that cannot fit): `response.status_code` 400 and `response.body.error` {message, type,
  param, code}, `param` naming the field when one is to blame.
- A line that failed while running: 500 with a server_error and a fixed message (the cause
  goes to the log).
- A line whose output ended but does not validate against its JSON schema (the grammar could
  only approximate the schema): 422 with an invalid_output_error naming the choice and what
  does not validate, never a 200 a client would take as valid.
- A line cancelled by an interrupted run: no response, and `error` {code: batch_cancelled}.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from ..sampling.logprobs import TokenLogprob
from ..request import FinishReason, Request, Result
from ..tools import Delta, ReasoningDelta, TextDelta, ToolCallStart
from .embeddings import POOLED_NONE_ERROR, dimensions_error, embeddings_body
from .reader import PromptItem

logger = logging.getLogger("multiseq.formats")

# What a line that failed while running says: its error may be an exception's text (a path, a
# library's message), which goes to the log, never into a file a client downloads.
FAILED_LINE_MESSAGE = "The server had an error while processing this request; its log has the details."


def _uid() -> str:
    return uuid.uuid4().hex[:24]


def openai_record(item: PromptItem, results: list[Result] | None, model_name: str) -> dict[str, Any]:
    """One OpenAI Batch output line for an item and the results of its choices (None: the
    line never ran)."""
    record = {"id": f"batch_req_{_uid()}", "custom_id": item.id, "response": None, "error": None}
    if results is None:
        record["response"] = _error_response(400, item.error, "invalid_request_error", item.error_param)
        return record
    invalid = next((r for r in results if r.is_invalid_request), None)
    failed = next((r for r in results if r.finish_reason is FinishReason.ERROR), None)
    cancelled = next((r for r in results if r.finish_reason is FinishReason.CANCELLED), None)
    if invalid is not None:
        record["response"] = _error_response(400, invalid.error, "invalid_request_error", None)
    elif failed is not None:
        logger.error("request %s failed: %s", failed.id, failed.error)
        record["response"] = _error_response(500, FAILED_LINE_MESSAGE, "server_error", None)
    elif cancelled is not None:
        record["error"] = {"code": "batch_cancelled",
                           "message": cancelled.error or "the run was interrupted before this request finished"}
    elif schema_failure(results) is not None:
        record["response"] = _error_response(INVALID_OUTPUT_STATUS, schema_failure(results), INVALID_OUTPUT,
                                             "response_format", INVALID_OUTPUT_CODE)
    elif item.embedding_encoding is not None:
        record["response"] = _embeddings_response(item, results, model_name)
    else:
        record["response"] = {"status_code": 200, "request_id": f"req_{_uid()}",
                              "body": completion_body(item, results, model_name)}
    return record


def _embeddings_response(item: PromptItem, results: list[Result], model_name: str) -> dict[str, Any]:
    """An embeddings line's response: a vector per input, or a 400 for what only the model
    could tell (its width, its pooling)."""
    width = results[0].embedding.shape[-1]
    if results[0].embedding.ndim != 1:
        return _error_response(400, POOLED_NONE_ERROR, "invalid_request_error", "input")
    if item.embedding_dimensions is not None and item.embedding_dimensions != width:
        return _error_response(400, dimensions_error(width), "invalid_request_error", "dimensions")
    return {"status_code": 200, "request_id": f"req_{_uid()}",
            "body": embeddings_body(results, model_name, item.embedding_encoding)}


def _error_response(status: int, message: str | None, kind: str, param: str | None,
                    code: str | None = None) -> dict[str, Any]:
    return {"status_code": status, "request_id": f"req_{_uid()}",
            "body": {"error": {"message": message, "type": kind, "param": param, "code": code}}}


# An output that ended but does not validate against the request's JSON schema.
INVALID_OUTPUT_STATUS = 422
INVALID_OUTPUT = "invalid_output_error"
INVALID_OUTPUT_CODE = "output_does_not_validate"


def schema_failure(results: list[Result]) -> str | None:
    """What is wrong with the first choice whose output does not validate against the
    request's JSON schema (None: every output that ended validates)."""
    return next((schema_failure_message(result, index, len(results))
                 for index, result in enumerate(results) if result.schema_error is not None), None)


def schema_failure_message(result: Result, index: int, num_choices: int) -> str:
    """A choice's validation failure in words: the choice (when there are several), what does
    not validate, and what the grammar approximated."""
    where = f"choice {index}: " if num_choices > 1 else ""
    approximated = f" (the grammar approximated: {', '.join(result.approximated)})" if result.approximated else ""
    return f"{where}{result.schema_error}{approximated}"


def response_id(is_chat: bool) -> str:
    """A new response id in OpenAI's form: chatcmpl-... or cmpl-..."""
    return f"{'chatcmpl' if is_chat else 'cmpl'}-{_uid()}"


def usage_of(results: list[Result], num_prompts: int = 1, prompt_only: bool = False) -> dict[str, Any]:
    """Token usage of a response. Each prompt is counted once, as OpenAI counts it for n > 1
    (the choices of one prompt are consecutive); `prompt_only`: no output was asked for."""
    firsts = results[::max(1, len(results) // num_prompts)]
    prompt_tokens = sum(result.prompt_tokens for result in firsts)
    completion_tokens = 0 if prompt_only else sum(result.completion_tokens for result in results)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens,
             # cached_tokens as OpenAI counts it (all reused); the part restored from RAM (--cache-ram) apart
             "prompt_tokens_details": {"cached_tokens": sum(result.prompt_tokens_cached for result in firsts),
                                       "cached_tokens_from_ram": sum(result.prompt_tokens_from_ram for result in firsts)}}
    details: dict[str, int] = {}
    reasoning = sum(result.reasoning_tokens for result in results)
    if reasoning:  # a reasoning model's: the part of completion_tokens spent reasoning
        details["reasoning_tokens"] = reasoning
    drafted = sum(result.draft_tokens for result in results)
    if drafted:  # speculative decoding's draft tokens, in the fields OpenAI gives predicted outputs
        accepted = sum(result.draft_tokens_accepted for result in results)
        details |= {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}
    if details:
        usage["completion_tokens_details"] = details
    return usage


def completion_body(item: PromptItem, results: list[Result], model_name: str, body_id: str | None = None,
                    created: int | None = None) -> dict[str, Any]:
    """The body of a 200 response: a chat.completion or a text_completion, a choice per result."""
    if item.is_chat:
        choices = [{"index": index, "message": chat_message(result), "logprobs": chat_logprobs(result.logprobs),
                    "finish_reason": result.finish_reason.value, **stop_reason(result)}
                   for index, result in enumerate(results)]
    elif item.echo:
        choices = [echoed_choice(index, request, result, item.echo_only)
                   for index, (request, result) in enumerate(zip(item.requests, results))]
    else:
        choices = [{"index": index, "text": result.text, "logprobs": completion_logprobs(result.logprobs),
                    "finish_reason": result.finish_reason.value} for index, result in enumerate(results)]
    body = {"id": body_id or response_id(item.is_chat), "object": "chat.completion" if item.is_chat else "text_completion",
            "created": created if created is not None else int(time.time()), "model": model_name,
            "choices": choices, "usage": usage_of(results, len(item.prompt_requests) or 1, item.echo_only)}
    return body | approximated_field(results)


def echoed_choice(index: int, request: Request, result: Result, prompt_only: bool) -> dict[str, Any]:
    """A completions choice that starts with its prompt (echo): the prompt's text and tokens,
    the first token's log probability null (nothing comes before it), then the output's
    tokens, the end-of-generation token that ended it included (scoring reads the entries
    before the last as the prompt's). `prompt_only` (max_tokens 0): the prompt alone."""
    prompt_text = request.prompt if isinstance(request.prompt, str) else \
        b"".join(result.prompt_token_bytes).decode("utf-8", "replace")
    text = prompt_text if prompt_only else prompt_text + result.text
    choice = {"index": index, "text": text, "logprobs": None,
              "finish_reason": FinishReason.LENGTH.value if prompt_only else result.finish_reason.value}
    if result.logprobs is None or result.prompt_logprobs is None:
        return choice
    output = () if prompt_only else result.logprobs + ((result.end_logprob,) if result.end_logprob else ())
    choice["logprobs"] = echoed_logprobs(result.prompt_token_bytes[0], (*result.prompt_logprobs, *output))
    return choice


def echoed_logprobs(first_token: bytes, logprobs: tuple[TokenLogprob, ...]) -> dict[str, Any]:
    """An echoed prompt's logprobs (and any output's after them): the first token's entry null,
    nothing coming before it."""
    entries = completion_logprobs(logprobs)
    first = first_token.decode("utf-8", "backslashreplace")
    offsets = [0, *(len(first) + offset for offset in entries["text_offset"])]
    return {"tokens": [first, *entries["tokens"]], "token_logprobs": [None, *entries["token_logprobs"]],
            "top_logprobs": [None, *entries["top_logprobs"]], "text_offset": offsets}


def stop_reason(result: Result) -> dict[str, Any]:
    """vLLM's `stop_reason`: the stop string that ended the choice (only when one did), so that
    the Messages API can say which of its stop_sequences matched."""
    return {"stop_reason": result.stop_string} if result.stop_string is not None else {}


def chat_message(result: Result) -> dict[str, Any]:
    """The assistant's message: its content (null when it only called tools), its calls, and
    what it reasoned (reasoning_content, as llama-server and vLLM name it)."""
    content = None if result.tool_calls and not result.text else result.text
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if result.reasoning is not None:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}}
                                 for call in result.tool_calls]
    return message


def chat_deltas(deltas: tuple[Delta, ...]) -> list[dict[str, Any]]:
    """A piece's parsed deltas as chat `delta` objects, one per chunk: runs of content and of
    reasoning joined; a call's start and the arguments after it in one tool_calls entry
    (OpenAI's shape: the first entry of call i has its index, id, type and name)."""
    merged: list[dict[str, Any]] = []
    for delta in deltas:
        last = merged[-1] if merged else None
        if isinstance(delta, (TextDelta, ReasoningDelta)):
            key = "content" if isinstance(delta, TextDelta) else "reasoning_content"
            if last is not None and set(last) == {key}:
                last[key] += delta.text
            else:
                merged.append({key: delta.text})
        elif isinstance(delta, ToolCallStart):
            merged.append({"tool_calls": [{"index": delta.index, "id": delta.id, "type": "function",
                                           "function": {"name": delta.name, "arguments": ""}}]})
        elif last is not None and "tool_calls" in last and last["tool_calls"][-1]["index"] == delta.index:
            last["tool_calls"][-1]["function"]["arguments"] += delta.text
        else:
            merged.append({"tool_calls": [{"index": delta.index, "function": {"arguments": delta.text}}]})
    return merged


def approximated_field(results: list[Result]) -> dict[str, Any]:
    """`schema_approximated`: what the constraint left out of the request's JSON schema (the
    outputs were validated against it afterwards); present only when something was."""
    return {"schema_approximated": list(results[0].approximated)} if results and results[0].approximated else {}


def stream_chunk(is_chat: bool, body_id: str, created: int, model_name: str, choices: list[dict[str, Any]],
                 usage: dict[str, Any] | None = None, with_usage_field: bool = False) -> dict[str, Any]:
    """One server-sent event's body of a streamed response (chat.completion.chunk, or a
    text_completion piece). With stream_options.include_usage every chunk has a usage field,
    null but in the last one, whose choices are empty."""
    chunk = {"id": body_id, "object": "chat.completion.chunk" if is_chat else "text_completion", "created": created,
             "model": model_name, "choices": choices}
    if with_usage_field:
        chunk["usage"] = usage
    return chunk


def stream_choice(is_chat: bool, index: int, text: str | None, logprobs: tuple[TokenLogprob, ...] | None,
                  finish_reason: str | None = None, first: bool = False, text_offset: int = 0,
                  delta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One choice of a streamed chunk: a chat delta (the first names the role; `delta`: a
    parsed one, from chat_deltas) or completion text, with the logprobs of its tokens when
    they were asked for (None: not asked)."""
    if is_chat:
        if delta is None:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": chat_logprobs(logprobs),
                "finish_reason": finish_reason}
    return {"index": index, "text": text or "", "logprobs": completion_logprobs(logprobs, text_offset),
            "finish_reason": finish_reason}


def chat_logprobs(logprobs: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """The chat API's logprobs: {content: [{token, logprob, bytes, top_logprobs}], refusal}."""
    if logprobs is None:
        return None
    content = [{"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.token_bytes),
                "top_logprobs": [{"token": top.text, "logprob": top.logprob, "bytes": list(top.token_bytes)}
                                 for top in entry.top_logprobs]}
               for entry in logprobs]
    return {"content": content, "refusal": None}


def completion_logprobs(logprobs: tuple[TokenLogprob, ...] | None, text_offset: int = 0) -> dict[str, Any] | None:
    """The completions API's logprobs: parallel lists of tokens, their logprobs, the top
    alternatives as {token: logprob}, and each token's character offset in the text (from
    text_offset: where a streamed piece starts in the whole text)."""
    if logprobs is None:
        return None
    offsets, offset = [], text_offset
    for entry in logprobs:
        offsets.append(offset)
        offset += len(entry.text)
    return {"tokens": [entry.text for entry in logprobs],
            "token_logprobs": [entry.logprob for entry in logprobs],
            "top_logprobs": [{top.text: top.logprob for top in entry.top_logprobs} for entry in logprobs],
            "text_offset": offsets}
