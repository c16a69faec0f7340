"""Result lines: one JSON object per request, in the input file's format.

- jsonl and text input: multiseq's own result object per line.
- openai input: the OpenAI Batch API output format, so tools that read those files read ours.

Where the lines go is output.py; reading them back for --resume is resume.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..runner import FinishReason, Result
from .reader import PromptFormat, PromptItem


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def result_record(result: Result) -> dict[str, Any]:
    """A finished request as one JSON-ready object (the jsonl and text formats)."""
    timings = result.timings
    return {
        "id": result.id,
        "text": result.text,
        "finish_reason": result.finish_reason.value,
        "error": result.error,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "truncated": result.truncated,
        "prompt_tokens_dropped": result.prompt_tokens_dropped,
        "tokens_shifted_out": result.tokens_shifted_out,
        "timings": {
            "queue_wait_s": _rounded(timings.queue_wait_s),
            "ttft_s": _rounded(timings.ttft_s),
            "prefill_tokens_per_s": _rounded(timings.prefill_tokens_per_s),
            "decode_tokens_per_s": _rounded(timings.decode_tokens_per_s),
            "total_s": _rounded(timings.total_s),
        },
    }


def item_error_record(item: PromptItem) -> dict[str, Any]:
    """A line that could not run, in the same shape as a result."""
    return {"id": item.id, "text": "", "finish_reason": "error", "error": item.error, "line": item.line_number,
            "prompt_tokens": 0, "completion_tokens": 0}


def _openai_body(item: PromptItem, result: Result, model_name: str) -> dict[str, Any]:
    usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
             "total_tokens": result.prompt_tokens + result.completion_tokens}
    created = int(time.time())
    reason = result.finish_reason.value
    if item.is_chat:
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": created,
                "model": model_name, "usage": usage,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                             "logprobs": None, "finish_reason": reason}]}
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": created,
            "model": model_name, "usage": usage,
            "choices": [{"index": 0, "text": result.text, "logprobs": None, "finish_reason": reason}]}


def openai_record(item: PromptItem, result: Result | None, model_name: str) -> dict[str, Any]:
    """One OpenAI Batch output line. A request that produced something is a 200 response
    (a cancelled one has finish_reason "cancelled"); one that failed or never started has a
    null response and an error object."""
    record = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": item.id, "response": None, "error": None}
    if result is None:
        record["error"] = {"code": "invalid_request", "message": item.error}
    elif result.finish_reason is FinishReason.ERROR or (
            result.finish_reason is FinishReason.CANCELLED and result.error is not None):
        code = "cancelled" if result.finish_reason is FinishReason.CANCELLED else "server_error"
        record["error"] = {"code": code, "message": result.error}
    else:
        record["response"] = {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex[:24]}",
                              "body": _openai_body(item, result, model_name)}
    return record


def record_for(prompt_format: PromptFormat, item: PromptItem, result: Result | None, model_name: str) -> dict:
    """The output line for an item, in the file's format."""
    if prompt_format is PromptFormat.OPENAI:
        return openai_record(item, result, model_name)
    return item_error_record(item) if result is None else result_record(result)
