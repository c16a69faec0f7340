"""Result lines out: one JSON object per input line, in the input file's format, and --resume.

- jsonl and text input: multiseq's own result object per line; a line with n > 1 choices
  gets a `choices` list of such objects instead of one text.
- openai input: the OpenAI Batch API output format (cli/openai_output.py), so tools that read
  those files read ours.

With an errors stream (--errors FILE), failed lines go there and successful ones to the
output, as OpenAI splits its output and error files.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ..runner import Result, TokenLogprob
from .openai_output import openai_record
from .reader import PromptFormat, PromptItem

_SUCCESS = ("stop", "length")


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
        **({} if result.logprobs is None else {"logprobs": logprobs_record(result.logprobs)}),
    }


def logprobs_record(logprobs: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """Per output token: its id, text, bytes and log probability, and the top alternatives."""
    return [{"token": entry.text, "id": entry.token_id, "logprob": entry.logprob, "bytes": list(entry.token_bytes),
             "top_logprobs": [{"token": top.text, "id": top.token_id, "logprob": top.logprob,
                               "bytes": list(top.token_bytes)} for top in entry.top_logprobs]}
            for entry in logprobs]


def choices_record(item: PromptItem, results: list[Result]) -> dict[str, Any]:
    """A line with n > 1: the prompt once, each choice's result (without its id) by index, and
    an error naming the choices that failed (null when all succeeded)."""
    choices = []
    for index, result in enumerate(results):
        choice = result_record(result)
        del choice["id"]
        choices.append({"index": index, **choice})
    failed = [str(choice["index"]) for choice in choices if not _choice_succeeded(choice)]
    error = None
    if failed:
        first = next(choice for choice in choices if not _choice_succeeded(choice))
        error = f"choice {', '.join(failed)} did not finish: {first['error'] or first['finish_reason']}"
    return {"id": item.id, "n": len(results), "error": error, "prompt_tokens": results[0].prompt_tokens,
            "completion_tokens": sum(result.completion_tokens for result in results), "choices": choices}


def _choice_succeeded(record: dict[str, Any]) -> bool:
    return record.get("error") is None and record.get("finish_reason") in _SUCCESS


def item_error_record(item: PromptItem) -> dict[str, Any]:
    """A line that could not run, in the same shape as a result; `param` names the field."""
    return {"id": item.id, "text": "", "finish_reason": "error", "error": item.error, "param": item.error_param,
            "line": item.line_number, "prompt_tokens": 0, "completion_tokens": 0}


def record_for(prompt_format: PromptFormat, item: PromptItem, results: list[Result] | None, model_name: str) -> dict:
    """The output line for an item and the results of its choices (None: it never ran), in the
    file's format."""
    if prompt_format is PromptFormat.OPENAI:
        return openai_record(item, results, model_name)
    if results is None:
        return item_error_record(item)
    return result_record(results[0]) if item.n == 1 else choices_record(item, results)


def record_id(record: dict[str, Any]) -> str:
    return str(record["custom_id"] if "custom_id" in record else record["id"])


def record_succeeded(record: dict[str, Any]) -> bool:
    """A line that finished successfully: every choice ended by stop or length. A 400 or 500
    response, an error, a cancelled or missing choice is not a success (--resume runs it again)."""
    if "custom_id" in record:
        response = record.get("response") or {}
        choices = (response.get("body") or {}).get("choices") or [{}]
        return response.get("status_code") == 200 and all(c.get("finish_reason") in _SUCCESS for c in choices)
    if "choices" in record:
        return record.get("error") is None and bool(record["choices"]) and all(
            _choice_succeeded(choice) for choice in record["choices"])
    return _choice_succeeded(record)


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
    nothing that finished. In input order, a line waits only for the lines before it. Lines
    that did not succeed go to errors_stream when one is given."""

    def __init__(self, stream, item_ids: list[str], keep_input_order: bool, errors_stream=None) -> None:
        self._stream = stream
        self._errors_stream = errors_stream if errors_stream is not None else stream
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
        stream = self._stream if record_succeeded(record) else self._errors_stream
        stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        stream.flush()
