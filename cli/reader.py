"""Prompt files in: three formats, detected per file, parsed line by line.

- jsonl: {"id"?, "prompt" | "messages", per-item sampling fields}; ids default to the line number.
- text: one prompt per line; ids are line numbers.
- openai: the OpenAI Batch API input format (custom_id, method, url, body).

A line that cannot run (bytes that are not UTF-8, malformed JSON, a field of the wrong type,
an empty prompt) becomes a PromptItem with an error naming its line number, so the rest of the
file still runs. Files are read lazily (read_prompts is a generator), so their size is no limit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..runner import Request, SamplingParams
from .lines import LineDecodeError, RawLine, decode_line, iter_lines


class PromptFormat(str, Enum):
    JSONL = "jsonl"
    TEXT = "text"
    OPENAI = "openai"


class TextMode(str, Enum):
    CHAT = "chat"  # each line is a user message, rendered with the chat template
    COMPLETION = "completion"  # each line is raw text to continue


CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"


@dataclass(frozen=True)
class PromptItem:
    line_number: int
    id: str
    request: Request | None
    error: str | None = None  # why this line cannot run
    is_chat: bool = False  # for OpenAI output: a chat.completion rather than a text_completion

    @property
    def is_valid(self) -> bool:
        return self.request is not None


class ItemError(ValueError):
    """One line's problem, said in words a user can act on."""


# --- fields and their types -----------------------------------------------------------------

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
_JSONL_FIELDS = {"id", "prompt", "messages"}
# OpenAI body fields that carry no meaning here but appear in every real file.
_OPENAI_IGNORED_FIELDS = {"model", "user", "metadata", "store"}


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
    raise ItemError(f"id must be a string or an integer, got {json.dumps(value)}")


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ItemError(f"not valid JSON ({error.msg} at column {error.colno})") from None
    except ValueError as error:  # an integer too long to convert, say
        raise ItemError(f"not valid JSON ({error})") from None
    except RecursionError:
        raise ItemError("not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ItemError("each line must be a JSON object")
    return data


def _reject_unknown(fields: set[str], known: set[str]) -> None:
    unknown = sorted(fields - known)
    if unknown:
        raise ItemError(f"unknown field {unknown[0]!r}")


# --- readers --------------------------------------------------------------------------------

def parse_jsonl_line(text: str, line_number: int, defaults: SamplingParams) -> PromptItem:
    """One JSONL line: {"id"?, "prompt" | "messages", per-item sampling fields}."""
    item_id = str(line_number)
    try:
        data = _json_object(text)
        item_id = _item_id(data.get("id"), line_number)
        _reject_unknown(set(data), _JSONL_FIELDS | set(SAMPLING_FIELDS))
        overrides = sampling_overrides({name: data[name] for name in SAMPLING_FIELDS if name in data})
        request = build_request(item_id, data.get("prompt"), data.get("messages"), overrides, defaults)
        return PromptItem(line_number, item_id, request, is_chat="messages" in data)
    except ItemError as error:
        return PromptItem(line_number, item_id, None, f"line {line_number}: {error}")


def parse_text_line(text: str, line_number: int, defaults: SamplingParams, mode: TextMode) -> PromptItem:
    item_id = str(line_number)
    prompt = text.rstrip("\r\n")
    if mode is TextMode.CHAT:
        request = Request(messages=[{"role": "user", "content": prompt}], id=item_id, sampling=defaults)
    else:
        request = Request(prompt=prompt, id=item_id, sampling=defaults)
    return PromptItem(line_number, item_id, request, is_chat=mode is TextMode.CHAT)


def parse_openai_line(text: str, line_number: int, defaults: SamplingParams) -> PromptItem:
    """One OpenAI Batch API input line: {custom_id, method, url, body}."""
    item_id = str(line_number)
    is_chat = False
    try:
        data = _json_object(text)
        item_id = _item_id(data.get("custom_id"), line_number)
        _reject_unknown(set(data), {"custom_id", "method", "url", "body"})
        if data.get("method", "POST") != "POST":
            raise ItemError(f"method must be POST, got {json.dumps(data.get('method'))}")
        url = data.get("url")
        if url not in (CHAT_URL, COMPLETIONS_URL):
            raise ItemError(f"url must be {CHAT_URL} or {COMPLETIONS_URL}, got {json.dumps(url)}")
        is_chat = url == CHAT_URL
        body = data.get("body")
        if not isinstance(body, dict):
            raise ItemError("'body' must be an object")
        request = _openai_request(item_id, body, is_chat, defaults)
        return PromptItem(line_number, item_id, request, is_chat=is_chat)
    except ItemError as error:
        return PromptItem(line_number, item_id, None, f"line {line_number}: {error}", is_chat=is_chat)


def _openai_request(item_id: str, body: dict[str, Any], is_chat: bool, defaults: SamplingParams) -> Request:
    content_field = "messages" if is_chat else "prompt"
    if content_field not in body:
        raise ItemError(f"'body' needs {content_field!r} for this url")
    fields = dict(body)
    if "max_completion_tokens" in fields:  # the newer name of max_tokens in the chat API
        fields.setdefault("max_tokens", fields.pop("max_completion_tokens"))
    if fields.pop("n", 1) != 1:
        raise ItemError("only n=1 is supported")
    known = {content_field} | set(SAMPLING_FIELDS) | _OPENAI_IGNORED_FIELDS
    _reject_unknown(set(fields), known)
    overrides = sampling_overrides({name: fields[name] for name in SAMPLING_FIELDS if name in fields})
    return build_request(item_id, fields.get("prompt"), fields.get("messages"), overrides, defaults)


def parse_line(line: RawLine, prompt_format: PromptFormat, defaults: SamplingParams,
               text_mode: TextMode = TextMode.CHAT) -> PromptItem | None:
    """One line of a prompts file as an item (None for a blank line). Whatever its bytes, the
    result is a request or an error naming the line: bytes that are not UTF-8 are that line's
    error, never the file's."""
    if line.is_blank:
        return None
    try:
        text = decode_line(line)
    except LineDecodeError as error:
        return PromptItem(line.number, str(line.number), None, f"line {line.number}: {error}")
    if prompt_format is PromptFormat.JSONL:
        return parse_jsonl_line(text, line.number, defaults)
    if prompt_format is PromptFormat.OPENAI:
        return parse_openai_line(text, line.number, defaults)
    return parse_text_line(text, line.number, defaults, text_mode)


def line_id(line: RawLine, prompt_format: PromptFormat) -> str | None:
    """The id parse_line gives this line (None for a blank line), found without building its
    request: what the duplicate-id check and --resume need from every line of a big file."""
    if line.is_blank:
        return None
    if prompt_format is PromptFormat.TEXT:
        return str(line.number)
    field = "custom_id" if prompt_format is PromptFormat.OPENAI else "id"
    try:
        return _item_id(_json_object(decode_line(line)).get(field), line.number)
    except (LineDecodeError, ItemError):
        return str(line.number)  # parse_line names such a line by its number too


def read_prompts(path: Path, prompt_format: PromptFormat, defaults: SamplingParams,
                 text_mode: TextMode = TextMode.CHAT) -> Iterator[PromptItem]:
    """The file's items, lazily, in file order: one line is read and parsed at a time."""
    for line in iter_lines(path):
        item = parse_line(line, prompt_format, defaults, text_mode)
        if item is not None:
            yield item


def detect_format(path: Path) -> PromptFormat:
    """JSON objects with a custom_id are OpenAI Batch input; other JSON objects are JSONL;
    anything else is plain text. Decided on the first non-blank line; a file with none is
    JSONL (it runs nothing either way)."""
    for line in iter_lines(path):
        if line.is_blank:
            continue
        try:
            data = _json_object(decode_line(line))
        except (LineDecodeError, ItemError):
            return PromptFormat.TEXT
        return PromptFormat.OPENAI if "custom_id" in data else PromptFormat.JSONL
    return PromptFormat.JSONL
