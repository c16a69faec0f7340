"""OpenAI's Responses API as a translation onto the Chat Completions path.

A Responses request (`input` items, `instructions`, flat function tools, `text.format`, ...)
becomes one Chat Completions body (`parse_request`, then `chat_body`); the chat.completion the
engine gives back becomes a Response object (`response_from_completion`), and a stream's typed
events (text, reasoning, calls: runner/server/stream.py) become the Responses API's server-sent
events (`EventTranslator`).
Tools the server cannot run (web search, file search, image generation, ...) are left out of
the prompt and named in the `x-multiseq-ignored-tools` header, never refused: Codex CLI sends
them with every request and gives up when they are refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..formats.fields import ItemError
from ..formats.tool_fields import read_tool
from .bodies import read_json
from .chat import CompletionCall, start_chat
from .stream import (ArgumentsPart, CallBegins, ChoiceEnds, ReasoningPart, StreamEvent, StreamFails, TextPart,
                     UsageKnown)
from .errors import INVALID_REQUEST, NOT_FOUND, ApiError, internal_error
from .pools import ServerPools
from .response_store import (
    MissingResponse,
    ResponseStore,
    StoredResponse,
    open_response_store,
)
from .sse import EventStream, sse
from .store import StoreError

logger = logging.getLogger("multiseq.server")

IGNORED_TOOLS_HEADER = "x-multiseq-ignored-tools"
CANCEL_WAIT_SECONDS = 10  # how long a cancel waits for the stream it stops to end
INPUT_ITEMS_LIMIT = (20, 100)  # (default, largest) items a page of input_items holds: OpenAI's
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TEXT_PART_TYPES = ("input_text", "output_text")
TOOL_CHOICE_MODES = ("auto", "none", "required")
# Input items the model never reads: reasoning comes back from earlier turns (often encrypted).
SKIPPED_ITEM_TYPES = ("reasoning",)
# Chat Completions fields that hold a Responses field under another name, for error messages.
CHAT_PARAM_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
                    "tools": "tools", "tool_choice": "tool_choice", "parallel_tool_calls": "parallel_tool_calls"}
# A tool's name goes into a response header only when it is plain printable ASCII.
_HEADER_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: `resp_...`, `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def bad_request(param: str, message: str) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param)


# --- the request ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request: its own input items (normalized, with ids, as they are
    stored and listed), the Chat Completions fields other than `messages`, and what the
    Response object echoes back."""

    input_items: list[dict[str, Any]]
    instructions: str | None
    chat_fields: dict[str, Any]
    echo: dict[str, Any]
    ignored_tools: list[str] = field(default_factory=list)
    is_stream: bool = False
    is_stored: bool = True
    previous_response_id: str | None = None


def parse_request(body: dict[str, Any]) -> ResponsesRequest:
    """Validate a POST /v1/responses body. Unknown fields are ignored (Codex sends new ones
    often); a field this server cannot honour or a malformed one is a 400 naming it."""
    if body.get("background"):
        raise bad_request("background", "'background' responses are not supported by this server: leave it "
                                        "out or false, and the response is answered directly.")
    if body.get("conversation") is not None:
        raise bad_request("conversation", "The Conversations API is not supported by this server; continue a "
                                          "conversation with 'previous_response_id' instead.")
    if "input" not in body:
        raise bad_request("input", "'input' is required: a string, or a list of input items.")
    input_items = normalize_input(body["input"])
    instructions = _optional(body, "instructions", str, "a string")
    function_tools, ignored = split_tools(body.get("tools"))
    tool_choice = body.get("tool_choice", "auto")
    previous_response_id = _optional(body, "previous_response_id", str, "a response id")
    parallel_tool_calls = _optional(body, "parallel_tool_calls", bool, "true or false")
    chat_fields: dict[str, Any] = {"model": body.get("model")} if body.get("model") is not None else {}
    if function_tools:
        chat_fields["tools"] = [_chat_tool(tool) for tool in function_tools]
    chat_fields |= _chat_tool_choice(tool_choice, function_tools, has_tools=bool(function_tools))
    if parallel_tool_calls is not None and function_tools:
        chat_fields["parallel_tool_calls"] = parallel_tool_calls
    chat_fields |= _sampling_fields(body)
    text = _text_config(body.get("text"))
    chat_fields |= _response_format(text["format"])
    echo = {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": _metadata(body.get("metadata")),
        "parallel_tool_calls": True if parallel_tool_calls is None else parallel_tool_calls,
        "previous_response_id": previous_response_id,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "store": _store_flag(body),
        "temperature": body.get("temperature"),
        "text": text,
        "tool_choice": tool_choice,
        "tools": function_tools,
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") if body.get("truncation") in ("auto", "disabled") else "disabled",
        "user": body.get("user") if isinstance(body.get("user"), str) else None,
        "background": False,
    }
    return ResponsesRequest(input_items, instructions, chat_fields, echo, ignored,
                            is_stream=_optional(body, "stream", bool, "true or false") or False,
                            is_stored=echo["store"], previous_response_id=previous_response_id)


def _optional(body: dict[str, Any], name: str, kind: type, description: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise bad_request(name, f"'{name}' must be {description}, got {json.dumps(value)}.")
    return value


def _store_flag(body: dict[str, Any]) -> bool:
    store = _optional(body, "store", bool, "true or false")
    return True if store is None else store  # OpenAI's default: responses are stored


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
        raise bad_request("metadata", "'metadata' must be an object of string values.")
    return value


def _sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """temperature, top_p, max_output_tokens and llama.cpp's `ignore_eos` (an extension: a
    benchmark that wants every reply max_output_tokens long, over every API) as Chat
    Completions fields; their ranges are the chat path's to check."""
    fields: dict[str, Any] = {}
    if body.get("ignore_eos") is not None:
        fields["ignore_eos"] = _optional(body, "ignore_eos", bool, "true or false")
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad_request(name, f"'{name}' must be a number, got {json.dumps(value)}.")
            fields[name] = value
    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int) or max_output_tokens < 1:
            raise bad_request("max_output_tokens", f"'max_output_tokens' must be a whole number of at least 1, "
                                                   f"got {json.dumps(max_output_tokens)}.")
        fields["max_tokens"] = max_output_tokens
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        fields["reasoning_effort"] = reasoning["effort"]  # the chat path checks the value
    return fields


# --- input items ---------------------------------------------------------------------------------

def normalize_input(value: Any) -> list[dict[str, Any]]:
    """The request's input as items in one shape (what is stored and listed by
    GET /v1/responses/{id}/input_items): a string is one user message; every item gets an
    id; message content becomes a list of text parts."""
    if isinstance(value, str):
        return [_message_item("user", [_text_part("input_text", value)])]
    if not isinstance(value, list):
        raise bad_request("input", "'input' must be a string or a list of input items.")
    return [_normalize_item(item, f"input[{index}]") for index, item in enumerate(value)]


def _normalize_item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise bad_request(where, f"{where} must be an object.")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _normalize_message(item, where)
    if kind == "function_call":
        return {"id": _item_id(item, "fc", where), "type": "function_call",
                "call_id": _required_string(item, "call_id", where), "name": _required_string(item, "name", where),
                "arguments": _required_string(item, "arguments", where, allow_empty=True), "status": "completed"}
    if kind == "function_call_output":
        return {"id": _item_id(item, "fco", where), "type": "function_call_output",
                "call_id": _required_string(item, "call_id", where),
                "output": _tool_output_text(item.get("output"), f"{where}.output"), "status": "completed"}
    if kind in SKIPPED_ITEM_TYPES:
        return {**item, "id": _item_id(item, "rs", where)}
    if kind is None:
        raise bad_request(f"{where}.type", f"{where} needs a 'type' (message, function_call, "
                                           f"function_call_output or reasoning) or a 'role'.")
    raise bad_request(f"{where}.type", f"{where} is a {json.dumps(kind)} item, which this server cannot honour: "
                                       f"it takes message, function_call, function_call_output and reasoning items.")


def _item_id(item: dict[str, Any], prefix: str, where: str) -> str:
    value = item.get("id")
    if value is None:
        return new_id(prefix)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}.id", f"{where}.id must be a non-empty string.")
    return value


def _required_string(item: dict[str, Any], name: str, where: str, allow_empty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not (value or allow_empty):
        raise bad_request(f"{where}.{name}", f"{where}.{name} must be a non-empty string, got {json.dumps(value)}.")
    return value


def _normalize_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise bad_request(f"{where}.role", f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}, "
                                           f"got {json.dumps(role)}.")
    content = item.get("content")
    default_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        parts = [_text_part(default_type, content)]
    elif isinstance(content, list):
        parts = [_content_part(part, f"{where}.content[{index}]") for index, part in enumerate(content)]
    else:
        raise bad_request(f"{where}.content", f"{where}.content must be a string or a list of content parts.")
    return _message_item(role, parts, item.get("id") if isinstance(item.get("id"), str) else None)


def _content_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind not in TEXT_PART_TYPES:
        if isinstance(kind, str):
            raise bad_request(f"{where}.type", f"{where} is an {json.dumps(kind)} part, which this server cannot "
                                               f"honour: the model reads text only (input_text, output_text).")
        raise bad_request(where, f"{where} must be an object with a 'type'.")
    if not isinstance(part.get("text"), str):
        raise bad_request(f"{where}.text", f"{where}.text must be a string.")
    return _text_part(kind, part["text"])


def _text_part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text, "annotations": []} if kind == "output_text" else {"type": kind, "text": text}


def _message_item(role: str, parts: list[dict[str, Any]], item_id: str | None = None) -> dict[str, Any]:
    return {"id": item_id or new_id("msg"), "type": "message", "role": role, "content": parts, "status": "completed"}


def _tool_output_text(value: Any, where: str) -> str:
    """A function_call_output's output: a string, or a list of input_text parts (joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "input_text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}[{index}]", f"{where}[{index}] must be an input_text part: the model "
                                                       f"reads text only.")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(where, f"{where} must be a string or a list of input_text parts.")


def chat_messages(instructions: str | None, items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized items as Chat Completions messages, `instructions` as a system message first.
    An assistant message and the function calls right after it (or function calls alone) are
    one assistant turn, as the model wrote them; a reasoning item's text (as this server writes
    it) becomes the reasoning_content of the turn after it, for a thinking template to render."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    turn: dict[str, Any] | None = None  # the assistant message being gathered
    thought = ""  # the text of reasoning items not yet given to a turn
    for item in items:
        kind = item["type"]
        if kind in SKIPPED_ITEM_TYPES:
            thought += _reasoning_text(item)
            continue
        if kind == "function_call":
            if turn is None:
                turn, thought = _assistant_turn(None, thought), ""
            turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
            continue
        if turn is not None:
            messages.append(turn)
            turn = None
        if kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif item["role"] == "assistant":
            turn, thought = _assistant_turn(message_text(item), thought), ""
        else:
            messages.append({"role": item["role"], "content": message_text(item)})
    if turn is not None:
        messages.append(turn)
    return messages


def _assistant_turn(content: str | None, thought: str) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if thought:
        turn["reasoning_content"] = thought
    return turn


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's readable text (its reasoning_text parts; an encrypted one has none)."""
    content = item.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(part["text"] for part in content
                   if isinstance(part, dict) and part.get("type") == "reasoning_text" and isinstance(part.get("text"), str))


def message_text(item: dict[str, Any]) -> str:
    """A message item's text: its parts joined by newlines, as the chat path joins parts."""
    return "\n".join(part["text"] if "text" in part else part["refusal"] for part in item["content"])


def chat_body(request: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The Chat Completions body for the request, after `history` (the items of the
    conversation it continues, oldest first)."""
    return {"messages": chat_messages(request.instructions, [*history, *request.input_items]),
            **request.chat_fields}


# --- tools ---------------------------------------------------------------------------------------

def split_tools(value: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The function tools, normalized to the Responses API's flat shape, and the names of the
    tools this server cannot run (left out of the prompt, never refused)."""
    if value is None:
        return [], []
    if not isinstance(value, list):
        raise bad_request("tools", "'tools' must be a list of tools.")
    functions, ignored = [], []
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise bad_request(where, f"{where} must be an object with a 'type'.")
        if tool["type"] == "function":
            functions.append(_function_tool(tool, where))
        else:
            ignored.append(_ignored_tool_label(tool))
    return functions, ignored


def _function_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A Responses function tool (its fields at the top level), checked as the chat API checks
    one, with the error naming the Responses field."""
    try:
        checked = read_tool(tool, where)
    except ItemError as error:
        raise bad_request(error.param or where, f"{error}.") from None
    return {"type": "function", "name": checked.name, "description": checked.description,
            "parameters": checked.parameters, "strict": checked.strict}


def _ignored_tool_label(tool: dict[str, Any]) -> str:
    """`type`, or `type:name` for a named one (a custom or MCP tool), for the response header."""
    name = tool.get("name") or tool.get("server_label")
    if isinstance(name, str) and _HEADER_SAFE_NAME.match(name):
        return f"{tool['type']}:{name}"
    return tool["type"] if _HEADER_SAFE_NAME.match(tool["type"]) else "unknown"


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"]}
    for name in ("description", "parameters", "strict"):
        if tool[name] is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


def _chat_tool_choice(value: Any, tools: list[dict[str, Any]], has_tools: bool) -> dict[str, Any]:
    """tool_choice as Chat Completions says it. Without function tools there is nothing to
    choose, so only a choice naming a function is an error then."""
    if value in TOOL_CHOICE_MODES:
        return {"tool_choice": value} if has_tools else {}
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or name not in {tool["name"] for tool in tools}:
            raise bad_request("tool_choice", f"tool_choice names the function {json.dumps(name)}, which is not "
                                             f"among the request's function tools.")
        return {"tool_choice": {"type": "function", "function": {"name": name}}}
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        return _allowed_tools_choice(value, tools)
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        raise bad_request("tool_choice", f"tool_choice asks for a {json.dumps(value['type'])} tool, which this "
                                         f"server cannot run; use \"auto\", \"none\", \"required\" or a function.")
    raise bad_request("tool_choice", f"tool_choice must be \"auto\", \"none\", \"required\" or "
                                     f"{{\"type\": \"function\", \"name\": ...}}, got {json.dumps(value)}.")


def _allowed_tools_choice(value: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """{"type": "allowed_tools", "mode", "tools"}: the prompt offers only the allowed functions."""
    mode = value.get("mode", "auto")
    allowed = value.get("tools")
    if mode not in ("auto", "required") or not isinstance(allowed, list):
        raise bad_request("tool_choice", "an allowed_tools tool_choice needs 'mode' (\"auto\" or \"required\") "
                                         "and a list of 'tools'.")
    names = {entry.get("name") for entry in allowed if isinstance(entry, dict) and entry.get("type") == "function"}
    kept = [_chat_tool(tool) for tool in tools if tool["name"] in names]
    return {"tools": kept, "tool_choice": mode} if kept else {"tools": [], "tool_choice": "none"}


# --- text format ---------------------------------------------------------------------------------

def _text_config(value: Any) -> dict[str, Any]:
    """The `text` config, with its format checked ({"type": "text"} when none is given)."""
    if value is None:
        return {"format": {"type": "text"}}
    if not isinstance(value, dict):
        raise bad_request("text", "'text' must be an object such as {\"format\": {\"type\": \"text\"}}.")
    text_format = value.get("format") or {"type": "text"}
    if not isinstance(text_format, dict) or text_format.get("type") not in ("text", "json_schema", "json_object"):
        raise bad_request("text.format", "text.format must have type \"text\", \"json_schema\" or \"json_object\".")
    if text_format["type"] == "json_schema":
        if not isinstance(text_format.get("name"), str) or not text_format["name"]:
            raise bad_request("text.format.name", "a json_schema text.format needs a 'name'.")
        if not isinstance(text_format.get("schema"), dict):
            raise bad_request("text.format.schema", "a json_schema text.format needs a 'schema' object.")
    return {**value, "format": text_format}


def _response_format(text_format: dict[str, Any]) -> dict[str, Any]:
    if text_format["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    if text_format["type"] != "json_schema":
        return {}
    schema = {name: text_format[name] for name in ("name", "schema", "strict", "description")
              if text_format.get(name) is not None}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


# --- the response --------------------------------------------------------------------------------

def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage in the Responses API's names; cached tokens are the prompt tokens whose
    cache the engine reused."""
    if chat_usage is None:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0), "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["prompt_tokens"] + chat_usage["completion_tokens"],
    }


@dataclass(frozen=True)
class Outcome:
    """How a response ended, from the chat finish_reason: its status and why it is incomplete."""

    status: str
    incomplete_reason: str | None = None

    @classmethod
    def of(cls, finish_reason: str | None) -> Outcome:
        if finish_reason == "length":
            return cls("incomplete", "max_output_tokens")
        if finish_reason == "cancelled":
            return cls("cancelled")
        return cls("completed")

    @property
    def item_status(self) -> str:
        """The status of the item the output ended in (the ones before it are complete)."""
        return "completed" if self.status == "completed" else "incomplete"


def response_object(request: ResponsesRequest, response_id: str, created_at: int, model: str,
                    outcome: Outcome | None, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Response object. `outcome` None: still in progress (the stream's first events)."""
    status = "in_progress" if outcome is None else "failed" if error is not None else outcome.status
    reason = outcome.incomplete_reason if outcome is not None else None
    return {
        "id": response_id, "object": "response", "created_at": created_at,
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status, "model": model, "output": output, "usage": usage, "error": error,
        "incomplete_details": {"reason": reason} if status == "incomplete" else None,
        **request.echo,
    }


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def message_output_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_text_part("output_text", text)]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: dict[str, Any], outcome: Outcome) -> list[dict[str, Any]]:
    """A chat completion's assistant message as output items: its reasoning, its text (also
    when empty, if it made no call: a response always says something), then one item per call.
    The last item is incomplete when the output was cut short."""
    reasoning, content = message.get("reasoning_content"), message.get("content")
    calls = message.get("tool_calls") or []
    items = []
    if reasoning:
        items.append(reasoning_item(new_id("rs"), reasoning, "completed"))
    if content or not calls:
        items.append(message_output_item(new_id("msg"), content or "", "completed"))
    items += [function_call_item(new_id("fc"), call["id"], call["function"]["name"], call["function"]["arguments"],
                                 "completed") for call in calls]
    items[-1]["status"] = outcome.item_status
    return items


def response_from_completion(request: ResponsesRequest, completion: dict[str, Any], response_id: str,
                             created_at: int, model: str) -> dict[str, Any]:
    """The Response object for a whole chat.completion body."""
    choice = completion["choices"][0]
    outcome = Outcome.of(choice.get("finish_reason"))
    return response_object(request, response_id, created_at, model, outcome,
                           output_items(choice["message"], outcome), usage_of(completion.get("usage")))


# --- streaming -----------------------------------------------------------------------------------

@dataclass
class _OpenItem:
    """The output item being streamed: what kind, where, and its text (or arguments) so far."""

    kind: str  # "reasoning", "message" or "function_call"
    output_index: int
    item_id: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    chat_index: int = -1  # for a call: its index among the chat delta's tool_calls


class EventTranslator:
    """Typed stream events in (runner/server/stream.py), the Responses API's stream events out
    (dicts; `sse` writes them). Items open in the order the model writes them and close when the next begins, so
    the streamed output equals the non-streamed one: reasoning, text, then the calls."""

    def __init__(self, request: ResponsesRequest, response_id: str, created_at: int, model: str) -> None:
        self._request = request
        self._response_id = response_id
        self._created_at = created_at
        self._model = model
        self._sequence_number = 0
        self._open: _OpenItem | None = None
        self._output: list[dict[str, Any]] = []
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._error: dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None  # the final Response object, once finished

    def start(self) -> list[dict[str, Any]]:
        """response.created and response.in_progress."""
        snapshot = self._response(None)
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, event: StreamEvent) -> list[dict[str, Any]]:
        """The Responses events one stream event makes (none for the end and the usage, said
        when the response finishes)."""
        if isinstance(event, ReasoningPart):
            return self._text_delta("reasoning", event.text) if event.text else []
        if isinstance(event, TextPart):
            return self._text_delta("message", event.text) if event.text else []
        if isinstance(event, CallBegins):
            return self._call_begins(event)
        if isinstance(event, ArgumentsPart):
            return self._arguments(event.text)
        if isinstance(event, ChoiceEnds):
            self._finish_reason = event.finish_reason
        elif isinstance(event, UsageKnown):
            self._usage = usage_of(event.usage)
        elif isinstance(event, StreamFails):
            self._error = {"code": "server_error", "message": event.message or "The response failed."}
        return []

    def finish(self) -> list[dict[str, Any]]:
        """Close the open item and end with response.completed, .incomplete or .failed (a
        cancelled response ends as failed, its status saying cancelled)."""
        outcome = Outcome.of(self._finish_reason)
        if self._error is None and not self._output and self._open is None:
            events = self._open_item("message", new_id("msg"))  # a response always says something
        else:
            events = []
        ended = "incomplete" if self._error is not None else outcome.item_status
        events += self._close_open_item(ended)
        self.response = self._response(outcome)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            self.response["status"], "response.failed")
        return [*events, self._event(kind, response=self.response)]

    def snapshot(self, outcome: Outcome | None = None) -> dict[str, Any]:
        """The Response object as it stands: the items finished so far."""
        return self._response(outcome)

    def cancel(self) -> None:
        """The response was cancelled on request: it ends so, not as the failure its stopped
        generation reports."""
        self._finish_reason = "cancelled"
        self._error = None

    def error_event(self) -> dict[str, Any]:
        """The `error` event of a stream that broke after its first event (details in the log)."""
        error = internal_error()
        return self._event("error", code=error.code or error.kind, message=error.message, param=None)

    # --- items ---

    def _text_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._close_open_item("completed")
            events += self._open_item(kind, new_id("rs" if kind == "reasoning" else "msg"))
        self._open.text += text
        delta_type = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self._event(delta_type, **self._where(), content_index=0, delta=text, **extra)]

    def _call_begins(self, call: CallBegins) -> list[dict[str, Any]]:
        return self._close_open_item("completed") + self._open_item(
            "function_call", new_id("fc"), call_id=call.id, name=call.name, chat_index=call.index)

    def _arguments(self, arguments: str) -> list[dict[str, Any]]:
        if not arguments or self._open is None or self._open.kind != "function_call":
            return []
        self._open.text += arguments
        return [self._event("response.function_call_arguments.delta", **self._where(), delta=arguments)]

    def _open_item(self, kind: str, item_id: str, **details: Any) -> list[dict[str, Any]]:
        self._open = _OpenItem(kind, len(self._output), item_id, **details)
        events = [self._event("response.output_item.added", output_index=self._open.output_index,
                              item=self._item("in_progress", is_added=True))]
        if kind != "function_call":
            events.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                      part=self._part(text="")))
        return events

    def _close_open_item(self, status: str) -> list[dict[str, Any]]:
        open_item = self._open
        if open_item is None:
            return []
        where = self._where()
        if open_item.kind == "function_call":
            events = [self._event("response.function_call_arguments.done", **where, name=open_item.name,
                                  arguments=open_item.text)]
        else:
            done = "response.reasoning_text.done" if open_item.kind == "reasoning" else "response.output_text.done"
            extra = {} if open_item.kind == "reasoning" else {"logprobs": []}
            events = [self._event(done, **where, content_index=0, text=open_item.text, **extra),
                      self._event("response.content_part.done", **where, content_index=0,
                                  part=self._part(text=open_item.text))]
        item = self._item(status)
        self._output.append(item)
        self._open = None
        return [*events, self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _item(self, status: str, is_added: bool = False) -> dict[str, Any]:
        open_item = self._open
        if open_item.kind == "function_call":
            return function_call_item(open_item.item_id, open_item.call_id, open_item.name,
                                      "" if is_added else open_item.text, status)
        make = reasoning_item if open_item.kind == "reasoning" else message_output_item
        item = make(open_item.item_id, open_item.text, status)
        if is_added:
            item["content"] = []  # the parts come with their own events
        return item

    def _part(self, text: str) -> dict[str, Any]:
        if self._open.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return _text_part("output_text", text)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open.item_id, "output_index": self._open.output_index}

    # --- envelopes ---

    def _response(self, outcome: Outcome | None) -> dict[str, Any]:
        return response_object(self._request, self._response_id, self._created_at, self._model, outcome,
                               list(self._output), self._usage, self._error)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence_number, **fields}
        self._sequence_number += 1
        return event


def chat_param(param: str | None) -> str | None:
    """A Chat Completions field named in an error, as the Responses request calls it. Only the
    field itself: message and chat-tool indices are not those of the request's items and tools."""
    if param is None:
        return None
    head = re.split(r"[.\[]", param, maxsplit=1)[0]
    return CHAT_PARAM_NAMES.get(head, param)


# --- the routes ----------------------------------------------------------------------------------

@dataclass
class _InFlight:
    """A streamed response being generated (its id went out in its first event): what
    POST /v1/responses/{id}/cancel stops."""

    call: CompletionCall
    translator: EventTranslator
    is_cancelled: bool = False
    final: dict[str, Any] | None = None  # the Response object it ended as
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ResponsesService:
    """The app's stored responses and those being generated."""

    def __init__(self, store: ResponseStore, pools: ServerPools) -> None:
        self.store = store
        self.pools = pools  # the store is read and written in the io pool
        self.in_flight: dict[str, _InFlight] = {}


async def service_of(request: HttpRequest) -> ResponsesService:
    """The app's service, made at its first use: the data directory's database when the server
    has one (opened off the event loop), else an in-memory store."""
    service = getattr(request.app.state, "responses", None)
    if service is None:
        pools = request.app.state.server.pools
        try:
            store = await pools.io(open_response_store, request.app.state.server.settings.data_dir)
        except StoreError as error:
            logger.error("%s", error)
            raise internal_error() from None
        service = getattr(request.app.state, "responses", None) or ResponsesService(store, pools)
        request.app.state.responses = service
    return service


async def create_response(request: HttpRequest) -> Response:
    """POST /v1/responses: the request runs as a chat completion; the answer is a Response
    object, or its events when streamed. A stored one is kept before the last event goes out,
    so a client may continue it at once."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    parsed = parse_request(body)
    service = await service_of(request)
    history = await _history(service, parsed.previous_response_id)
    chat = chat_body(parsed, history) | ({"stream": True} if parsed.is_stream else {})
    call = await _renamed_errors(start_chat(request, chat, "responses"))
    response_id, created_at, model = new_id("resp"), int(time.time()), state.settings.model_name
    headers = {IGNORED_TOOLS_HEADER: ", ".join(parsed.ignored_tools)} if parsed.ignored_tools else None
    if parsed.is_stream:
        translator = EventTranslator(parsed, response_id, created_at, model)
        events = _stream_events(service, parsed, response_id, _InFlight(call, translator))
        return EventStream(events, on_disconnect=call.cancel, headers=headers,
                           error_event=lambda: sse(translator.error_event(), "error"))
    # Not streamed, the client learns the id only at the end: there is nothing it could cancel.
    completion = await _renamed_errors(call.completion(request))
    if completion is None:
        return Response(status_code=499)  # the client went away: its job is cancelled, no one to answer
    response = response_from_completion(parsed, completion, response_id, created_at, model)
    await _keep(service, parsed, response)
    return JSONResponse(response, headers=headers)


async def _history(service: ResponsesService, previous_response_id: str | None) -> list[dict[str, Any]]:
    if previous_response_id is None:
        return []
    try:
        return await service.pools.io(service.store.conversation, previous_response_id)
    except MissingResponse as missing:
        which = ("is not stored" if missing.response_id == previous_response_id
                 else f"continues {missing.response_id}, which is not stored")
        raise ApiError(404, f"The previous response {previous_response_id} {which} (deleted, created with "
                            f"store false, or forgotten by a server without a data directory).", NOT_FOUND,
                       "previous_response_id", "previous_response_not_found") from None


async def _renamed_errors(awaitable: Any) -> Any:
    """Await a chat call, its errors naming the Responses fields instead of the chat ones."""
    try:
        return await awaitable
    except ApiError as error:
        raise ApiError(error.status, error.message, error.kind, chat_param(error.param), error.code,
                       error.headers) from None


async def _keep(service: ResponsesService, parsed: ResponsesRequest, response: dict[str, Any]) -> None:
    if parsed.is_stored:
        record = StoredResponse(response["id"], response["created_at"], parsed.previous_response_id,
                                parsed.input_items, response)
        await service.pools.io(service.store.put, record)


async def _stream_events(service: ResponsesService, parsed: ResponsesRequest, response_id: str,
                         flight: _InFlight) -> AsyncIterator[str]:
    translator = flight.translator
    service.in_flight[response_id] = flight
    try:
        for event in translator.start():
            yield sse(event, event["type"])
        async for part in flight.call.events():
            for event in translator.feed(part):
                yield sse(event, event["type"])
        if flight.is_cancelled:
            translator.cancel()
        last_events = translator.finish()
        await _keep(service, parsed, translator.response)
        flight.final = translator.response
        for event in last_events:
            yield sse(event, event["type"])
    finally:
        service.in_flight.pop(response_id, None)
        flight.done.set()


async def get_response(request: HttpRequest) -> Response:
    return JSONResponse((await _stored(request)).response)


async def delete_response(request: HttpRequest) -> Response:
    service = await service_of(request)
    response_id = request.path_params["response_id"]
    if not await service.pools.io(service.store.delete, response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def cancel_response(request: HttpRequest) -> Response:
    """Stop a response being generated (it ends with status "cancelled"); a finished one is
    returned as it is."""
    service = await service_of(request)
    flight = service.in_flight.get(request.path_params["response_id"])
    if flight is None:
        return JSONResponse((await _stored(request)).response)
    flight.is_cancelled = True
    flight.call.cancel()
    try:  # the stream ends at the engine's next step, unless its client stopped reading
        await asyncio.wait_for(flight.done.wait(), CANCEL_WAIT_SECONDS)
    except TimeoutError:
        pass
    return JSONResponse(flight.final or flight.translator.snapshot(Outcome("cancelled")))


async def list_input_items(request: HttpRequest) -> Response:
    """GET /v1/responses/{id}/input_items: the response's own input items, paged like OpenAI's
    (`order` desc by default, `after` an item id, `limit` 1 to 100)."""
    record = await _stored(request)
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"'order' must be \"asc\" or \"desc\", got {json.dumps(order)}.", param="order")
    limit = query.get("limit", str(INPUT_ITEMS_LIMIT[0]))
    if not limit.isdigit() or not 1 <= int(limit) <= INPUT_ITEMS_LIMIT[1]:
        raise ApiError(400, f"'limit' must be a whole number from 1 to {INPUT_ITEMS_LIMIT[1]}, got "
                            f"{json.dumps(limit)}.", param="limit")
    items = record.input_items if order == "asc" else record.input_items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise ApiError(404, f"The response {record.id} has no input item {json.dumps(after)}.", NOT_FOUND,
                           "after", "item_not_found")
        items = items[ids.index(after) + 1:]
    page = items[:int(limit)]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)})


async def _stored(request: HttpRequest) -> StoredResponse:
    service = await service_of(request)
    response_id = request.path_params["response_id"]
    record = await service.pools.io(service.store.get, response_id)
    if record is None:
        raise _not_found(response_id)
    return record


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response {json.dumps(response_id)} is stored.", NOT_FOUND, "response_id",
                    "response_not_found")


ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
]
