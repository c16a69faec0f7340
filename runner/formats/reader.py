"""Prompt files in: three formats, detected per file, parsed line by line.

- jsonl: {"id"?, "prompt" | "messages", per-item sampling fields}; ids default to the line number;
  or {"id"?, "input", "pooling"?}: the input's embedding (embeddings.py).
- text: one prompt per line; ids are line numbers.
- openai: the OpenAI Batch API input format (custom_id, method, url, body), the url
  /v1/chat/completions, /v1/completions or /v1/embeddings.

A line that cannot run (bytes that are not UTF-8, malformed JSON, a field of the wrong type,
an empty prompt, a field that cannot be honoured) becomes a PromptItem with an error naming
its line number and the field, so the rest of the file still runs. The fields themselves are
in fields.py. Files are read lazily (read_prompts is a generator), so their size is no limit.

A line with `n` > 1 stands for n requests of the same prompt, one per choice, with ids
`<id>#<k>` inside the runner; their results are written back as one line.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..config import DEFAULT_POOLING, POOLINGS, SamplingParams, is_int
from ..request import Request
from .media_input import PromptWithMedia
from .fields import (COMMON_FIELDS, IGNORED_OPENAI_FIELDS, REASONING_BUDGET_FIELDS, SAMPLING_FIELDS, ItemError, chat_messages,
                     check_constraint_compiles, choice_count, completion_logprobs, completion_prompts, constraint_param,
                     echo_fields, non_finite_path, reject_unsupported, response_format_overrides, sampling_overrides)
from .embeddings import embedding_inputs, embeddings_body_requests, encoding_format, input_requests
from .lines import LineDecodeError, RawLine, decode_line, iter_lines
from .tool_fields import TOOL_FIELDS, tool_overrides


class PromptFormat(str, Enum):
    JSONL = "jsonl"
    TEXT = "text"
    OPENAI = "openai"


class TextMode(str, Enum):
    CHAT = "chat"  # each line is a user message, rendered with the chat template
    COMPLETION = "completion"  # each line is raw text to continue


CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"


@dataclass(frozen=True)
class PromptItem:
    line_number: int
    id: str
    request: Request | None  # the request of choice 0 (of the only choice when n is 1)
    error: str | None = None  # why this line cannot run
    is_chat: bool = False  # for OpenAI output: a chat.completion rather than a text_completion
    n: int = 1  # choices asked for (of every prompt, when the body gave a list of prompts)
    error_param: str | None = None  # the field the error is about (OpenAI's `param`)
    # A completions body with a list of prompts: each prompt's request (`request` is the first's);
    # its n choices each, in prompt order, are the item's choices.
    prompt_requests: tuple[Request, ...] = ()
    echo: bool = False  # completions' echo: each choice's text (and logprobs) start with its prompt's
    echo_only: bool = False  # echo with max_tokens 0: the prompt alone (its scores), no output
    # An embeddings item (each prompt request embeds its input): how its vectors are written
    # (float or base64; None: not an embeddings item), and the width its body asked for.
    embedding_encoding: str | None = None
    embedding_dimensions: int | None = None

    @property
    def is_valid(self) -> bool:
        return self.request is not None

    @property
    def requests(self) -> list[Request]:
        """One request per choice. Choice k of a seeded line gets seed + k, so the choices differ
        and the line is reproducible; without a seed, their ids give them seeds of their own."""
        if self.request is None:
            return []
        if self.n == 1:
            return [self.request]
        prompts = self.prompt_requests or (self.request,)
        per_prompt = self.n // len(prompts)
        return [_choice_request(prompts[index // per_prompt], choice_id(self.id, index), index % per_prompt)
                for index in range(self.n)]

    @property
    def request_ids(self) -> list[str]:
        return [self.id] if self.n == 1 else [choice_id(self.id, index) for index in range(self.n)]


def embeddings_item(item_id: str, requests: tuple[Request, ...], encoding: str = "float",
                    dimensions: int | None = None, line_number: int = 0) -> PromptItem:
    """An item of embedding requests, one per input, each its own choice."""
    return PromptItem(line_number, item_id, requests[0], n=len(requests),
                      prompt_requests=requests if len(requests) > 1 else (), embedding_encoding=encoding,
                      embedding_dimensions=dimensions)


def choice_id(item_id: str, index: int) -> str:
    return f"{item_id}#{index}"


def _choice_request(request: Request, request_id: str, index: int) -> Request:
    seed = request.sampling.seed
    sampling = request.sampling if seed is None else dataclasses.replace(request.sampling, seed=(seed + index) % 2**64)
    return dataclasses.replace(request, id=request_id, sampling=sampling)


# --- one line's fields ----------------------------------------------------------------------

_JSONL_FIELDS = {"id", "prompt", "messages"} | COMMON_FIELDS | TOOL_FIELDS
_OPENAI_CHECKED_FIELDS = {"modalities", "echo", "best_of"}  # accepted at their neutral values


def line_overrides(fields: dict[str, Any]) -> dict[str, Any]:
    """A line's sampling fields, response_format, max_completion_tokens (the newer name of
    max_tokens; max_tokens wins when both are given) and repetition_penalty (vLLM's name of
    repeat_penalty, which wins likewise) as SamplingParams keywords."""
    overrides = sampling_overrides({name: fields[name] for name in SAMPLING_FIELDS if name in fields})
    if fields.get("repetition_penalty") is not None and "repeat_penalty" not in overrides:  # vLLM's name
        try:  # checked here, so that its error names the field the client sent
            value = sampling_overrides({"repeat_penalty": fields["repetition_penalty"]})["repeat_penalty"]
            overrides["repeat_penalty"] = SamplingParams(repeat_penalty=value).repeat_penalty
        except (ItemError, ValueError) as error:
            raise ItemError(str(error).replace("repeat_penalty", "repetition_penalty"), "repetition_penalty") from None
    if fields.get("max_completion_tokens") is not None and "max_tokens" not in overrides:
        try:
            overrides["max_tokens"] = sampling_overrides({"max_tokens": fields["max_completion_tokens"]})["max_tokens"]
        except ItemError as error:
            raise ItemError(str(error).replace("'max_tokens'", "'max_completion_tokens'"),
                            "max_completion_tokens") from None
    if fields.get("response_format") is not None:
        overrides.update(response_format_overrides(fields["response_format"]))
    overrides.update(_reasoning_budget(fields))
    return overrides


def _reasoning_budget(fields: dict[str, Any]) -> dict[str, Any]:
    """The reasoning budget under the first of its names the line gives (vLLM's or llama-server's)."""
    name = next((name for name in REASONING_BUDGET_FIELDS if fields.get(name) is not None), None)
    if name is None:
        return {}
    value = fields[name]
    if not is_int(value) or value < -1:
        raise ItemError(f"field {name!r} must be an integer >= -1 (-1: no limit, 0: no reasoning), got "
                        f"{json.dumps(value)}", name)
    return {"reasoning_budget": value}


def build_request(item_id: str, prompt: Any, messages: Any, overrides: dict[str, Any],
                  defaults: SamplingParams, constraint_field: str = "response_format",
                  tools: dict[str, Any] | None = None, media_root: Path | None = None) -> Request:
    """A Request from one item's parts (`tools`: its tool fields as Request keywords; media
    files read under media_root); ItemError names what is wrong. A schema or grammar is
    compiled here, so a bad one fails its line before the run starts."""
    if tools and messages is None:
        raise ItemError("tools need 'messages': a prompt is not rendered by the chat template", "tools")
    if prompt is None and messages is None:
        raise ItemError("needs a 'prompt' or 'messages'")
    media: tuple[bytes, ...] = ()
    if isinstance(prompt, PromptWithMedia):  # llama-server's {"prompt_string", "multimodal_data"}
        prompt, media = prompt.text, prompt.media
    if prompt is not None and not isinstance(prompt, tuple) and (not isinstance(prompt, str) or not prompt.strip()):
        raise ItemError("'prompt' must be a non-empty string", "prompt")
    if messages is not None:
        messages = chat_messages(messages, media_root)
    try:
        sampling = dataclasses.replace(defaults, **overrides)
    except ValueError as error:
        raise ItemError(str(error), _field_named_in(str(error), overrides)) from None
    check_constraint_compiles(sampling, constraint_field)
    try:
        return Request(prompt=prompt, messages=messages, id=item_id, sampling=sampling, media=media, **(tools or {}))
    except ValueError as error:
        raise ItemError(str(error)) from None


def _field_named_in(message: str, overrides: dict[str, Any]) -> str | None:
    """The field a SamplingParams error is about: the line's field its message starts with."""
    return next((name for name in overrides if message.startswith(name)), None)


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


def _reject_non_finite(data: dict[str, Any]) -> None:
    where = non_finite_path(data)
    if where is not None:
        raise ItemError(f"'{where}' is not a finite number: NaN and Infinity are not JSON numbers", where)


def _reject_unknown(fields: set[str], known: set[str]) -> None:
    unknown = sorted(fields - known)
    if unknown:
        raise ItemError(f"unknown field {unknown[0]!r}", unknown[0])


# --- readers --------------------------------------------------------------------------------

def parse_jsonl_line(text: str, line_number: int, defaults: SamplingParams, media_root: Path | None = None) -> PromptItem:
    """One JSONL line: {"id"?, "prompt" | "messages", "n"?, per-item sampling fields}, or an
    embeddings line: {"id"?, "input", "pooling"?}."""
    item_id = str(line_number)
    try:
        data = _json_object(text)
        item_id = _item_id(data.get("id"), line_number)
        _reject_non_finite(data)
        if "input" in data:  # an embeddings line
            return _jsonl_embeddings_item(data, item_id, line_number)
        _reject_unknown(set(data), _JSONL_FIELDS | set(SAMPLING_FIELDS))
        n = choice_count(data.get("n", 1))
        request = build_request(item_id, data.get("prompt"), data.get("messages"), line_overrides(data), defaults,
                                constraint_param(data), tool_overrides(data), media_root)
        return PromptItem(line_number, item_id, request, is_chat="messages" in data, n=n)
    except ItemError as error:
        return PromptItem(line_number, item_id, None, f"line {line_number}: {error}", error_param=error.param)


def _jsonl_embeddings_item(data: dict[str, Any], item_id: str, line_number: int) -> PromptItem:
    """{"id"?, "input": text or token ids, "pooling"?}: the input's embedding."""
    _reject_unknown(set(data), {"id", "input", "pooling"})
    pooling = data.get("pooling", DEFAULT_POOLING)
    if pooling not in (*POOLINGS, DEFAULT_POOLING):
        raise ItemError(f"'pooling' must be one of {', '.join(POOLINGS)}, got {json.dumps(pooling)}", "pooling")
    inputs = embedding_inputs(data["input"])
    if len(inputs) > 1:
        raise ItemError("'input' holds one text (or one list of token ids) per line", "input")
    return embeddings_item(item_id, input_requests(item_id, inputs, pooling), line_number=line_number)


def parse_text_line(text: str, line_number: int, defaults: SamplingParams, mode: TextMode) -> PromptItem:
    item_id = str(line_number)
    prompt = text.rstrip("\r\n")
    if mode is TextMode.CHAT:
        request = Request(messages=[{"role": "user", "content": prompt}], id=item_id, sampling=defaults)
    else:
        request = Request(prompt=prompt, id=item_id, sampling=defaults)
    return PromptItem(line_number, item_id, request, is_chat=mode is TextMode.CHAT)


def parse_openai_line(text: str, line_number: int, defaults: SamplingParams,
                      media_root: Path | None = None) -> PromptItem:
    """One OpenAI Batch API input line: {custom_id, method, url, body}."""
    item_id = str(line_number)
    is_chat = False
    try:
        data = _json_object(text)
        item_id = _item_id(data.get("custom_id"), line_number)
        _reject_non_finite(data)
        _reject_unknown(set(data), {"custom_id", "method", "url", "body"})
        if data.get("method", "POST") != "POST":
            raise ItemError(f"method must be POST, got {json.dumps(data.get('method'))}", "method")
        url = _openai_url(data.get("url"))
        if url == EMBEDDINGS_URL:
            body = data.get("body")
            requests = embeddings_body_requests(item_id, body)
            return embeddings_item(item_id, requests, encoding_format(body), body.get("dimensions"), line_number)
        is_chat = url == CHAT_URL
        return openai_body_item(item_id, data.get("body"), is_chat, defaults, line_number, media_root)
    except ItemError as error:
        return PromptItem(line_number, item_id, None, f"line {line_number}: {error}", is_chat=is_chat,
                          error_param=error.param)


def _openai_url(url: Any) -> str:
    if url not in (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL):
        raise ItemError(f"url must be {CHAT_URL}, {COMPLETIONS_URL} or {EMBEDDINGS_URL}, got {json.dumps(url)}", "url")
    return url


def openai_body_item(item_id: str, body: Any, is_chat: bool, defaults: SamplingParams,
                     line_number: int = 0, media_root: Path | None = None) -> PromptItem:
    """One OpenAI request body, for /v1/chat/completions (is_chat) or /v1/completions: what a
    Batch API line carries and what the server receives. The one translation of a body into
    requests; ItemError (naming the field) when it cannot run."""
    if not isinstance(body, dict):
        raise ItemError("the request body must be a JSON object", "body")
    n = choice_count(body.get("n", 1))
    if is_chat:
        if body.get("echo"):
            raise ItemError("field 'echo' cannot be honoured for chat: it repeats a completions prompt", "echo")
        return PromptItem(line_number, item_id, _openai_request(item_id, body, is_chat, defaults, media_root),
                          is_chat=is_chat, n=n)
    prompts = completion_prompts(body.get("prompt"))
    echo, echo_only, body = echo_fields(body, n)
    requests = tuple(_openai_request(item_id, body | {"prompt": prompt}, is_chat, defaults) for prompt in prompts)
    return PromptItem(line_number, item_id, requests[0], is_chat=is_chat, n=n * len(requests),
                      prompt_requests=requests if len(requests) > 1 else (), echo=echo, echo_only=echo_only)


def _known_body_fields(is_chat: bool) -> set[str]:
    known = set(SAMPLING_FIELDS) | COMMON_FIELDS | IGNORED_OPENAI_FIELDS | _OPENAI_CHECKED_FIELDS
    return known | ({"messages"} | TOOL_FIELDS if is_chat else {"prompt", "logprobs"})


def unknown_body_fields(body: dict[str, Any], is_chat: bool) -> list[str]:
    """The fields of a Chat Completions (is_chat) or Completions body that this runner does not
    know, sorted: what openai_body_item refuses, and what a server may drop instead."""
    return sorted(set(body) - _known_body_fields(is_chat))


def _openai_request(item_id: str, body: dict[str, Any], is_chat: bool, defaults: SamplingParams,
                    media_root: Path | None = None) -> Request:
    content_field = "messages" if is_chat else "prompt"
    if content_field not in body:
        raise ItemError(f"{content_field!r} is required for {CHAT_URL if is_chat else COMPLETIONS_URL}",
                        content_field)
    reject_unsupported(body)
    fields = dict(body)
    # The completions API's logprobs is a count of alternatives; the chat API's is true/false.
    extra = {} if is_chat else completion_logprobs(fields.pop("logprobs", None), bool(fields.pop("echo", None)))
    _reject_unknown(set(fields), _known_body_fields(is_chat))
    overrides = line_overrides(fields) | extra
    return build_request(item_id, fields.get("prompt"), fields.get("messages"), overrides, defaults,
                         constraint_param(fields), tool_overrides(fields) if is_chat else None, media_root)


def parse_line(line: RawLine, prompt_format: PromptFormat, defaults: SamplingParams,
               text_mode: TextMode = TextMode.CHAT, media_root: Path | None = None) -> PromptItem | None:
    """One line of a prompts file as an item (None for a blank line). Whatever its bytes, the
    result is a request or an error naming the line: bytes that are not UTF-8 are that line's
    error, never the file's. Images a line names by path are read under media_root."""
    if line.is_blank:
        return None
    try:
        text = decode_line(line)
    except LineDecodeError as error:
        return PromptItem(line.number, str(line.number), None, f"line {line.number}: {error}")
    if prompt_format is PromptFormat.JSONL:
        return parse_jsonl_line(text, line.number, defaults, media_root)
    if prompt_format is PromptFormat.OPENAI:
        return parse_openai_line(text, line.number, defaults, media_root)
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
                 text_mode: TextMode = TextMode.CHAT, media_root: Path | None = None) -> Iterator[PromptItem]:
    """The file's items, lazily, in file order: one line is read and parsed at a time. Images
    a line names by path are read from media_root (default: the file's folder) and below."""
    for line in iter_lines(path):
        item = parse_line(line, prompt_format, defaults, text_mode, media_root or path.parent)
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
