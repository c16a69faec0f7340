"""Prompt files in, result lines out.

A prompt file becomes a list of PromptItems, one per non-blank line. A line that cannot run
(malformed JSON, a field of the wrong type, an empty prompt) is an item with an error that
names its line number, so the rest of the file still runs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import Request, Result, SamplingParams


@dataclass(frozen=True)
class PromptItem:
    line_number: int
    id: str
    request: Request | None
    error: str | None = None  # why this line cannot run

    @property
    def is_valid(self) -> bool:
        return self.request is not None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_stop(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value))


# Per-item sampling fields a prompt line may carry, and the JSON type each must have.
SAMPLING_FIELDS = {
    "max_tokens": (_is_integer, "an integer"),
    "temperature": (_is_number, "a number"),
    "top_k": (_is_integer, "an integer"),
    "top_p": (_is_number, "a number"),
    "min_p": (_is_number, "a number"),
    "repeat_penalty": (_is_number, "a number"),
    "seed": (_is_integer, "an integer"),
    "stop": (_is_stop, "a string or a list of strings"),
    "ignore_eos": (lambda value: isinstance(value, bool), "true or false"),
}
_ITEM_FIELDS = {"id", "prompt", "messages"}


class ItemError(ValueError):
    """One line's problem, said in words a user can act on."""


def sampling_overrides(fields: dict[str, Any]) -> dict[str, Any]:
    """Check the per-item sampling fields' types; return them as SamplingParams keywords."""
    overrides = {}
    for name, value in fields.items():
        check, expected = SAMPLING_FIELDS[name]
        if value is None:
            continue
        if not check(value):
            raise ItemError(f"field {name!r} must be {expected}, got {json.dumps(value)}")
        overrides[name] = tuple([value] if isinstance(value, str) else value) if name == "stop" else value
    return overrides


def build_request(item_id: str, prompt: Any, messages: Any, overrides: dict[str, Any],
                  defaults: SamplingParams) -> Request:
    """A Request from one item's parts; ItemError names what is wrong."""
    if prompt is None and messages is None:
        raise ItemError("needs a 'prompt' or 'messages'")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise ItemError("'prompt' must be a non-empty string")
    if messages is not None and not isinstance(messages, list):
        raise ItemError("'messages' must be a list of {role, content} objects")
    try:
        sampling = dataclasses.replace(defaults, **overrides)
        return Request(prompt=prompt, messages=messages, id=item_id, sampling=sampling)
    except ValueError as error:
        raise ItemError(str(error)) from None


def _item_id(value: Any, line_number: int) -> str:
    if value is None:
        return str(line_number)
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
        return str(value)
    raise ItemError(f"'id' must be a string or an integer, got {json.dumps(value)}")


def parse_jsonl_line(text: str, line_number: int, defaults: SamplingParams) -> PromptItem:
    """One JSONL line: {"id"?, "prompt" | "messages", per-item sampling fields}."""
    item_id = str(line_number)
    try:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ItemError(f"not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(data, dict):
            raise ItemError("each line must be a JSON object")
        item_id = _item_id(data.get("id"), line_number)
        unknown = sorted(set(data) - _ITEM_FIELDS - set(SAMPLING_FIELDS))
        if unknown:
            raise ItemError(f"unknown field {unknown[0]!r}")
        overrides = sampling_overrides({name: data[name] for name in SAMPLING_FIELDS if name in data})
        request = build_request(item_id, data.get("prompt"), data.get("messages"), overrides, defaults)
        return PromptItem(line_number, item_id, request)
    except ItemError as error:
        return PromptItem(line_number, item_id, None, f"line {line_number}: {error}")


def read_jsonl(path: Path, defaults: SamplingParams) -> list[PromptItem]:
    items = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                items.append(parse_jsonl_line(line, line_number, defaults))
    return items


def result_record(result: Result) -> dict[str, Any]:
    """A finished request as one JSON-ready object."""
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


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


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
        self._pending[self._position[record["id"]]] = record
        while self._next_position in self._pending:
            self._write_line(self._pending.pop(self._next_position))
            self._next_position += 1

    def _write_line(self, record: dict[str, Any]) -> None:
        self._stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._stream.flush()
