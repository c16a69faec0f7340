"""Result lines out: one JSON object per request, in the input file's format, and --resume.

- jsonl and text input: multiseq's own result object per line.
- openai input: the OpenAI Batch API output format, so tools that read those files read ours.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
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
        "prompt_tokens_cached": result.prompt_tokens_cached,
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
             "total_tokens": result.prompt_tokens + result.completion_tokens,
             "prompt_tokens_details": {"cached_tokens": result.prompt_tokens_cached}}
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


def record_id(record: dict[str, Any]) -> str:
    return str(record["custom_id"] if "custom_id" in record else record["id"])


def record_succeeded(record: dict[str, Any]) -> bool:
    """A line of an earlier run's output that finished successfully (stop or length)."""
    if "custom_id" in record:
        response = record.get("response") or {}
        choices = (response.get("body") or {}).get("choices") or [{}]
        return response.get("status_code") == 200 and choices[0].get("finish_reason") in ("stop", "length")
    return record.get("error") is None and record.get("finish_reason") in ("stop", "length")


def keep_succeeded_lines(path: Path) -> set[str]:
    """For --resume: rewrite the output file with only its successful lines (atomically, so a
    crash leaves the old file) and return their ids. Failed, cancelled and torn lines go, so
    their ids run again and each id ends up in the file once."""
    if not path.exists():
        return set()
    kept_lines, kept_ids = [], set()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a killed run
            if isinstance(record, dict) and record_succeeded(record) and record_id(record) not in kept_ids:
                kept_ids.add(record_id(record))
                kept_lines.append(line if line.endswith("\n") else line + "\n")
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".resume")
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.writelines(kept_lines)
    os.replace(temporary, path)
    return kept_ids


class ResultWriter:
    """Writes one JSON line per finished item and flushes it at once, so a killed run loses
    nothing that finished. In input order, a line waits only for the lines before it."""

    def __init__(self, stream, item_ids: list[str], keep_input_order: bool) -> None:
        self._stream = stream
        self._keep_input_order = keep_input_order
        self._position = {item_id: index for index, item_id in enumerate(item_ids)}
        self._pending: dict[int, dict[str, Any]] = {}
        self._next_position = 0

    def write(self, record: dict[str, Any]) -> None:
        if not self._keep_input_order:
            self._write_line(record)
            return
        self._pending[self._position[record_id(record)]] = record
        while self._next_position in self._pending:
            self._write_line(self._pending.pop(self._next_position))
            self._next_position += 1

    def flush_pending(self) -> None:
        """Write whatever input-order lines still wait (an interrupted run ends with gaps)."""
        for position in sorted(self._pending):
            self._write_line(self._pending.pop(position))

    def _write_line(self, record: dict[str, Any]) -> None:
        self._stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._stream.flush()
