"""Anthropic's Messages API, translated at the door onto the Chat Completions path.

`POST /v1/messages` (Claude Code adds `?beta=true`) and `POST /v1/messages/count_tokens`. A
Messages body becomes a Chat Completions body (`translate_request`), the chat.completion that
comes back becomes a Message (`message_of`), and a stream's chat.completion.chunk bodies become
Anthropic's server-sent events (`message_events`). One engine, one request shape, one sessions
cache: nothing here knows about the model, the template or tool-call formats.

Errors on these routes are Anthropic's shape, {"type": "error", "error": {"type", "message"}},
with the status the Chat Completions path would give; a 400 names the field in its message
(`messages[1].content[0].tool_use_id: ...`), since Anthropic's errors carry no `param`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from ..tools.types import Tool
from .bodies import read_json
from .chat import count_prompt_tokens, start_chat
from .stream import (ArgumentsPart, CallBegins, ChoiceEnds, ReasoningPart, StreamEvent, StreamFails, TextPart,
                     UsageKnown)
from .errors import ApiError, internal_error
from .sse import EventStream, sse

logger = logging.getLogger("multiseq.server")

# Anthropic's error types, by the HTTP status they come with (its "Errors" page).
ERROR_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# A failure reported inside a stream has no status: its OpenAI type says what it was.
ERROR_TYPES_BY_OPENAI_TYPE = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "not_found_error": "not_found_error",
    "overloaded_error": "overloaded_error",
}
API_ERROR = "api_error"

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # "stop": end_turn or stop_sequence
TOOL_USE_ID_PREFIX = "toolu_"
MESSAGE_ID_PREFIX = "msg_"
# Between text blocks that become one Chat Completions content string: a newline, as the Chat
# Completions path joins text parts and the Responses API joins input_text parts, so that one
# conversation renders to the same prompt tokens (and hits the same cache) through every API.
BLOCK_SEPARATOR = "\n"
TOOL_ERROR_PREFIX = "Error: "  # Chat Completions tool messages have no is_error: the text says it
ENDPOINT = "/v1/messages"
IGNORED_TOOLS_HEADER = "x-multiseq-ignored-tools"
# Claude Code waits on long prompts without a byte for minutes; Anthropic pings to keep proxies
# and clients from timing out. Every 10 s keeps well inside the 15 s such clients tolerate.
PING_INTERVAL_S = 10.0

# Blocks a local text model cannot read: refused by name rather than silently dropped.
UNREADABLE_BLOCKS = ("image", "document")
# Reasoning a client cannot read back (redacted); a thinking block's text becomes the turn's
# reasoning_content, which a thinking template renders where it keeps reasoning.
DROPPED_BLOCKS = ("thinking", "redacted_thinking")
CUSTOM_TOOL_TYPE = "custom"
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # "tool" names a function


@dataclass(frozen=True)
class MessagesRequest:
    """A Messages request body, translated: the Chat Completions body to run, and what the
    answer needs that the chat layer does not keep (the stop sequences asked for, the server
    tools left out)."""

    chat_body: dict[str, Any]
    model: str
    is_stream: bool = False
    stop_sequences: tuple[str, ...] = ()
    ignored_tools: tuple[str, ...] = ()


def invalid(path: str, reason: str) -> ApiError:
    """A 400 whose message starts with the field at fault, as Anthropic's do."""
    return ApiError(400, f"{path}: {reason}", param=path)


# --- request: Messages body -> Chat Completions body ------------------------------------------

def translate_request(body: dict[str, Any], for_counting: bool = False) -> MessagesRequest:
    """The Chat Completions body for a Messages body, or an ApiError naming the bad field.
    `for_counting` (count_tokens): max_tokens is not required and sampling is left out."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "a model name is required")
    tools, ignored = _tools(body.get("tools"))
    messages = _system_messages(body.get("system")) + _conversation(body.get("messages"))
    chat_body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        chat_body["tools"] = tools
    chat_body.update(_tool_choice(body.get("tool_choice")))
    if for_counting:
        return MessagesRequest(chat_body, model, ignored_tools=ignored)
    chat_body["max_tokens"] = _max_tokens(body.get("max_tokens"))
    # The chat layer checks their values; ignore_eos is llama.cpp's extension, as on Chat Completions.
    for name in ("temperature", "top_p", "top_k", "ignore_eos"):
        if body.get(name) is not None:
            chat_body[name] = body[name]
    chat_body.update(_thinking(body.get("thinking")))
    stop_sequences = _stop_sequences(body.get("stop_sequences"))
    if stop_sequences:
        chat_body["stop"] = list(stop_sequences)
    is_stream = body.get("stream", False)
    if is_stream is None:
        is_stream = False
    if not isinstance(is_stream, bool):
        raise invalid("stream", "must be true or false")
    if is_stream:
        chat_body["stream"] = True
        chat_body["stream_options"] = {"include_usage": True}
    return MessagesRequest(chat_body, model, is_stream, stop_sequences, ignored)


def _thinking(value: Any) -> dict[str, Any]:
    """Anthropic's extended thinking ({"type": "enabled", "budget_tokens": N} or {"type":
    "disabled"}) as the switch thinking templates read (enable_thinking). The budget is not a
    limit here: max_tokens bounds the whole reply."""
    if value is None:
        return {}
    if not isinstance(value, dict) or value.get("type") not in ("enabled", "disabled", "adaptive"):
        raise invalid("thinking", "must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}")
    thinks = value["type"] != "disabled"
    return {"chat_template_kwargs": {"enable_thinking": thinks, "thinking": thinks}}


def _max_tokens(value: Any) -> int:
    if value is None:
        raise invalid("max_tokens", "Field required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid("max_tokens", f"must be an integer of at least 1, got {json.dumps(value)}")
    return value


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(stop, str) and stop for stop in value):
        raise invalid("stop_sequences", "must be a list of non-empty strings")
    return tuple(value)


def _system_messages(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        text = system
    elif isinstance(system, list):
        text = BLOCK_SEPARATOR.join(_text_of(block, f"system[{index}]") for index, block in enumerate(system))
    else:
        raise invalid("system", "must be a string or a list of text blocks")
    return [{"role": "system", "content": text}] if text else []


def _text_of(block: Any, path: str) -> str:
    """A text block's text (other blocks are refused where only text may stand)."""
    if not isinstance(block, dict) or block.get("type") != "text":
        raise invalid(f"{path}.type", "only text blocks are allowed here")
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(f"{path}.text", "must be a string")
    return text


def _conversation(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list of messages")
    converted: list[dict[str, Any]] = []
    previous_tool_uses: dict[str, str] = {}  # id -> name, of the assistant message just before
    for index, message in enumerate(messages):
        path = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(path, "must be an object with 'role' and 'content'")
        blocks = _blocks(message.get("content"), f"{path}.content")
        role = message.get("role")
        if role == "user":
            converted += _user_messages(blocks, f"{path}.content", previous_tool_uses)
            previous_tool_uses = {}
        elif role == "assistant":
            assistant = _assistant_message(blocks, f"{path}.content")
            converted.append(assistant)
            previous_tool_uses = {call["id"]: call["function"]["name"] for call in assistant.get("tool_calls", [])}
        elif role == "system":  # Claude Code puts reminders between turns as system messages
            converted.append({"role": "system", "content": BLOCK_SEPARATOR.join(
                _text_of(block, f"{path}.content[{number}]") for number, block in enumerate(blocks))})
        else:
            raise invalid(f"{path}.role", f"must be 'user', 'assistant' or 'system', got {json.dumps(role)}")
    return converted


def _blocks(content: Any, path: str) -> list[dict[str, Any]]:
    """A message's content as a list of blocks, each an object with a known, readable type."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(path, "must be a string or a list of content blocks")
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise invalid(f"{path}[{index}].type", "each content block needs a type")
        if kind in UNREADABLE_BLOCKS:
            raise invalid(f"{path}[{index}].type", f"'{kind}' blocks are not supported: this server runs a "
                                                    "text-only model")
    return content


def _user_messages(blocks: list[dict[str, Any]], path: str, tool_uses: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, in order, then its text as one user
    message (Anthropic puts the results first; a turn of results only has no user message)."""
    results, texts = [], []
    for index, block in enumerate(blocks):
        kind, where = block["type"], f"{path}[{index}]"
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "tool_result":
            results.append(_tool_message(block, where, tool_uses))
        elif kind not in DROPPED_BLOCKS:
            raise invalid(f"{where}.type", f"'{kind}' blocks are not allowed in a user message")
    if texts or not results:
        results.append({"role": "user", "content": BLOCK_SEPARATOR.join(texts)})
    return results


def _tool_message(block: dict[str, Any], path: str, tool_uses: dict[str, str]) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise invalid(f"{path}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
    if tool_use_id not in tool_uses:
        raise invalid(f"{path}.tool_use_id", f"unexpected tool_use_id {json.dumps(tool_use_id)}: each tool_result "
                                             "must answer a tool_use block of the previous (assistant) message")
    content = block.get("content", "")
    if isinstance(content, list):
        content = BLOCK_SEPARATOR.join(_text_of(part, f"{path}.content[{index}]") for index, part in enumerate(content))
    elif not isinstance(content, str):
        raise invalid(f"{path}.content", "must be a string or a list of text blocks")
    is_error = block.get("is_error", False)
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid(f"{path}.is_error", "must be true or false")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": TOOL_ERROR_PREFIX + content if is_error else content}


def _assistant_message(blocks: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """An assistant turn: its text as content, its tool_use blocks as tool_calls, its thinking
    blocks as reasoning_content (a thinking model's template renders it back where it keeps
    reasoning, so the next prompt starts with the tokens the model wrote)."""
    texts, calls, thoughts = [], [], []
    for index, block in enumerate(blocks):
        kind, where = block["type"], f"{path}[{index}]"
        if kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        elif kind not in DROPPED_BLOCKS:
            raise invalid(f"{where}.type", f"'{kind}' blocks are not allowed in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": BLOCK_SEPARATOR.join(texts) if texts or not calls
                               else None}
    if calls:
        message["tool_calls"] = calls
    if any(thoughts):
        message["reasoning_content"] = "".join(thoughts)
    return message


def _tool_call(block: dict[str, Any], path: str) -> dict[str, Any]:
    for name in ("id", "name"):
        if not isinstance(block.get(name), str) or not block[name]:
            raise invalid(f"{path}.{name}", "must be a non-empty string")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise invalid(f"{path}.input", "must be an object")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _tools(tools: Any) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The custom tools as Chat Completions functions, and the names of the server tools (a
    `type` such as web_search_20250305) left out: a local model cannot run them, and clients
    that send them break when they are refused."""
    if tools is None:
        return [], ()
    if not isinstance(tools, list):
        raise invalid("tools", "must be a list of tools")
    functions, ignored = [], []
    for index, tool in enumerate(tools):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise invalid(path, "must be an object with 'name' and 'input_schema'")
        if tool.get("type", CUSTOM_TOOL_TYPE) != CUSTOM_TOOL_TYPE:
            ignored.append(str(tool.get("name") or tool.get("type")))
            continue
        functions.append(_function(tool, path))
    return functions, tuple(ignored)


def _function(tool: dict[str, Any], path: str) -> dict[str, Any]:
    name, description, schema = tool.get("name"), tool.get("description"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise invalid(f"{path}.name", "must be a non-empty string")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{path}.description", "must be a string")
    if not isinstance(schema, dict):
        raise invalid(f"{path}.input_schema", "Field required: the JSON schema of the tool's input (an object)")
    return Tool(name, description, schema).openai()


def _tool_choice(choice: Any) -> dict[str, Any]:
    """tool_choice and parallel_tool_calls for the chat body (nothing when not given)."""
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("tool_choice.name", "a tool_choice of type 'tool' names the tool")
        translated: dict[str, Any] = {"tool_choice": {"type": "function", "function": {"name": name}}}
    elif kind in TOOL_CHOICES:
        translated = {"tool_choice": TOOL_CHOICES[kind]}
    else:
        raise invalid("tool_choice.type", f"must be one of auto, any, tool, none; got {json.dumps(kind)}")
    disable_parallel = choice.get("disable_parallel_tool_use")
    if disable_parallel is not None and not isinstance(disable_parallel, bool):
        raise invalid("tool_choice.disable_parallel_tool_use", "must be true or false")
    if disable_parallel:
        translated["parallel_tool_calls"] = False
    return translated


# --- response: chat.completion -> Message -----------------------------------------------------

def message_id(chat_id: str) -> str:
    """The Message id for a chat.completion id (the same hex, so logs can be matched)."""
    return MESSAGE_ID_PREFIX + chat_id.split("-", 1)[-1]


def tool_use_id(call_id: str) -> str:
    """Anthropic's ids of tool uses start with toolu_; the chat layer's call ids do not."""
    return call_id if call_id.startswith(TOOL_USE_ID_PREFIX) else TOOL_USE_ID_PREFIX + call_id.removeprefix("call_")


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    """Anthropic's usage: input_tokens excludes what was read from the (prefix) cache."""
    chat_usage = chat_usage or {}
    prompt_tokens = chat_usage.get("prompt_tokens", 0)
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": prompt_tokens - cached, "output_tokens": chat_usage.get("completion_tokens", 0),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def stop_reason_of(finish_reason: str | None, stop_sequence: str | None) -> str:
    """Anthropic's stop_reason for the chat layer's finish_reason ("stop" is end_turn unless a
    stop sequence ended the output)."""
    if finish_reason == "cancelled":
        raise ApiError(503, "The server is shutting down; the request was cancelled.", "overloaded_error",
                       code="shutting_down")
    if finish_reason == "stop":
        return "end_turn" if stop_sequence is None else "stop_sequence"
    return STOP_REASONS.get(finish_reason or "", "end_turn")


def matched_stop_sequence(choice: dict[str, Any], stop_sequences: tuple[str, ...]) -> str | None:
    """Which of the request's stop sequences ended the output, when one did. The chat layer's
    finish_reason says "stop" for both an end-of-generation token and a stop string, so this
    reads the matched string from the choice's `stop_reason` (vLLM's field for it)."""
    matched = choice.get("stop_reason")
    return matched if isinstance(matched, str) and matched in stop_sequences else None


def message_of(completion: dict[str, Any], request: MessagesRequest) -> dict[str, Any]:
    """The Message for a whole chat.completion."""
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
                        "input": _tool_input(call["function"]["arguments"])})
    stop_sequence = matched_stop_sequence(choice, request.stop_sequences)
    return {"id": message_id(completion["id"]), "type": "message", "role": "assistant",
            "model": completion.get("model", request.model), "content": content,
            "stop_reason": stop_reason_of(choice.get("finish_reason"), stop_sequence),
            "stop_sequence": stop_sequence, "usage": usage_of(completion.get("usage"))}


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is (the chat layer hands out only
    calls it could parse, so anything else is a server fault, not the client's)."""
    value = json.loads(arguments) if arguments else {}
    if not isinstance(value, dict):
        raise TypeError(f"tool call arguments are not a JSON object: {arguments[:200]!r}")
    return value


# --- errors -------------------------------------------------------------------------------------

def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    """The seam's ApiError (OpenAI's shape) as Anthropic's error, same status and headers."""
    error_type = ERROR_TYPES_BY_STATUS.get(error.status, API_ERROR if error.status >= 500 else "invalid_request_error")
    message = error.message
    if error.prompt_too_long is not None:  # Anthropic's words, which Claude Code acts on (it compacts)
        too_long = error.prompt_too_long
        message = f"prompt is too long: {too_long.num_prompt} tokens > {too_long.max_prompt} maximum; {message}"
    return JSONResponse(error_body(error_type, message), status_code=error.status, headers=error.headers)


def stream_error_event(openai_error: dict[str, Any]) -> str:
    """An `error` event for a failure the chat layer reported mid-stream ({"error": {...}})."""
    details = openai_error.get("error") or {}
    error_type = ERROR_TYPES_BY_OPENAI_TYPE.get(details.get("type"), API_ERROR)
    return sse_event("error", error_body(error_type, details.get("message") or "The generation failed."))


# --- streaming: the answer's typed events -> Anthropic's events -------------------------------

def sse_event(event_type: str, data: dict[str, Any]) -> str:
    """An Anthropic event: named by its type, which its data repeats."""
    return sse(data, event=event_type)


PING = sse_event("ping", {"type": "ping"})
EMPTY_BLOCKS = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking", "thinking": "", "signature": ""}}


@dataclass
class _OpenBlock:
    index: int
    kind: str  # "text", "thinking" or "tool_use"
    call_index: int | None = None  # the chat layer's index of a tool_use block's call


@dataclass
class MessageStream:
    """Turns an answer's typed events (runner/server/stream.py) into Anthropic's events, block
    by block: each kind (reasoning, text, a call) opens a block when the one before is of
    another kind."""

    request: MessagesRequest
    message_id: str
    _open: _OpenBlock | None = None
    _num_blocks: int = 0
    _finish_reason: str | None = None
    _stop_sequence: str | None = None
    _usage: dict[str, Any] | None = None
    _call_blocks: dict[int, int] = field(default_factory=dict)  # call index -> block index

    def start(self) -> list[str]:
        """message_start (empty content; the usage comes in message_delta, once known), a ping."""
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.request.model,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_of(None)}
        return [sse_event("message_start", {"type": "message_start", "message": message}), PING]

    def feed(self, event: StreamEvent) -> list[str]:
        """The Anthropic events of one stream event (none for the end and the usage, said when
        the message finishes)."""
        if isinstance(event, ReasoningPart) and event.text:
            return self._append("thinking", {"type": "thinking_delta", "thinking": event.text})
        if isinstance(event, TextPart) and event.text:
            return self._append("text", {"type": "text_delta", "text": event.text})
        if isinstance(event, CallBegins):
            return self._open_block("tool_use", {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name,
                                                 "input": {}}, event.index)
        if isinstance(event, ArgumentsPart) and event.text and event.index in self._call_blocks:
            return [self._delta(self._call_blocks[event.index], {"type": "input_json_delta", "partial_json": event.text})]
        if isinstance(event, ChoiceEnds):
            self._finish_reason = event.finish_reason
            self._stop_sequence = (event.stop_string if event.stop_string in self.request.stop_sequences else None)
        elif isinstance(event, UsageKnown):
            self._usage = event.usage
        return []

    def finish(self) -> list[str]:
        """Close the open block, then message_delta (stop reason, usage) and message_stop."""
        events = self._close()
        usage = usage_of(self._usage)
        delta = {"stop_reason": stop_reason_of(self._finish_reason, self._stop_sequence),
                 "stop_sequence": self._stop_sequence}
        events.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        events.append(sse_event("message_stop", {"type": "message_stop"}))
        return events

    def _append(self, kind: str, delta: dict[str, Any]) -> list[str]:
        is_open = self._open is not None and self._open.kind == kind
        events = [] if is_open else self._open_block(kind, dict(EMPTY_BLOCKS[kind]))
        return events + [self._delta(self._num_blocks - 1, delta)]

    def _open_block(self, kind: str, block: dict[str, Any], call_index: int | None = None) -> list[str]:
        events = self._close()
        self._open = _OpenBlock(self._num_blocks, kind, call_index)
        if call_index is not None:
            self._call_blocks[call_index] = self._num_blocks
        self._num_blocks += 1
        return events + [sse_event("content_block_start", {"type": "content_block_start", "index": self._open.index,
                                                            "content_block": block})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        index, events = self._open.index, []
        if self._open.kind == "thinking":  # Anthropic's clients expect a signature before it stops
            events.append(self._delta(index, {"type": "signature_delta", "signature": ""}))
        events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        self._open = None
        return events

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> str:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


async def message_events(parts: AsyncIterator[StreamEvent], request: MessagesRequest, message_id: str,
                         ping_interval: float = PING_INTERVAL_S) -> AsyncIterator[str]:
    """The server-sent events of a streamed Message, from the answer's typed events; a `ping`
    whenever nothing came for `ping_interval` seconds (a long prompt waiting for its slot). A
    failure mid-stream ends it with an `error` event."""
    stream = MessageStream(request, message_id)
    for event in stream.start():
        yield event
    async for part in with_pings(parts, ping_interval):
        if part is None:
            yield PING
        elif isinstance(part, StreamFails):
            yield stream_error_event(part.body)
            return
        else:
            for event in stream.feed(part):
                yield event
    try:
        events = stream.finish()
    except ApiError as error:  # cancelled: the server is shutting down
        yield sse_event("error", error_body(ERROR_TYPES_BY_STATUS[error.status], error.message))
        return
    for event in events:
        yield event


async def with_pings(items: AsyncIterator[Any], interval: float) -> AsyncIterator[Any]:
    """The items of `items`, with a None after every `interval` seconds that passed without one."""
    iterator = aiter(items)
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()


# --- the routes ---------------------------------------------------------------------------------

def _in_anthropic_shape(route: Callable[[HttpRequest], Awaitable[Response]]) -> Callable[[HttpRequest],
                                                                                           Awaitable[Response]]:
    """Errors of a Messages route in Anthropic's shape: the seam's ApiErrors converted, anything
    unexpected logged and answered with a fixed message."""
    async def answer(request: HttpRequest) -> Response:
        try:
            return await route(request)
        except ApiError as error:
            return error_response(error)
        except Exception:
            logger.exception("unexpected error on %s %s", request.method, request.url.path)
            return error_response(internal_error())
    return answer


@_in_anthropic_shape
async def create_message(request: HttpRequest) -> Response:
    """POST /v1/messages: a Message, or with "stream": true its events."""
    state = request.app.state.server
    state.ready_runner()
    translated = translate_request(await read_json(request, state.settings.max_body_bytes))
    headers = _ignored_tools_header(translated.ignored_tools)
    call = await start_chat(request, translated.chat_body, api="messages")
    identity = message_id(call.body_id)
    if translated.is_stream:
        return EventStream(message_events(call.events(), translated, identity), on_disconnect=call.cancel,
                           headers=headers, error_event=_internal_error_event)
    completion = await call.completion(request)
    if completion is None:  # the client went away: its request was cancelled, no one to answer
        return Response(status_code=499)
    return JSONResponse(message_of(completion, translated), headers=headers)


@_in_anthropic_shape
async def count_tokens(request: HttpRequest) -> Response:
    """POST /v1/messages/count_tokens: the prompt's tokens, as the model's template renders it."""
    state = request.app.state.server
    state.ready_runner()
    translated = translate_request(await read_json(request, state.settings.max_body_bytes), for_counting=True)
    return JSONResponse({"input_tokens": await count_prompt_tokens(request, translated.chat_body)})


def _ignored_tools_header(names: tuple[str, ...]) -> dict[str, str]:
    """The server tools left out, as a header (ASCII: a header cannot carry any name a client sends)."""
    if not names:
        return {}
    return {IGNORED_TOOLS_HEADER: ", ".join(names).encode("ascii", "replace").decode("ascii")}


def _internal_error_event() -> str:
    return sse_event("error", error_body(API_ERROR, internal_error().message))
