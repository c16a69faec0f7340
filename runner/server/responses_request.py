"""A Responses API request checked, and translated into the fields of a Chat Completions body
(`parse_request`, then `chat_body`): its sampling fields, tools, tool choice and text format.

Tools the server cannot run (web search, file search, image generation, ...) are left out of
the prompt and named by the route in the `x-multiseq-ignored-tools` header, never refused: Codex
CLI sends them with every request and gives up when they are refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..formats.fields import REASONING_BUDGET_FIELDS, ItemError
from ..formats.tool_fields import read_tool
from .responses_input import bad_request, chat_messages, normalize_input

TOOL_CHOICE_MODES = ("auto", "none", "required")
# Chat Completions fields that hold a Responses field under another name, for error messages.
CHAT_PARAM_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
                    "tools": "tools", "tool_choice": "tool_choice", "parallel_tool_calls": "parallel_tool_calls"}
# A tool's name goes into a response header only when it is plain printable ASCII.
_HEADER_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


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
    for name in (*REASONING_BUDGET_FIELDS, "reasoning_budget_message"):  # vLLM's and llama-server's, as on chat
        if body.get(name) is not None:
            fields[name] = body[name]
    return fields


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


# --- errors --------------------------------------------------------------------------------------

def chat_param(param: str | None) -> str | None:
    """A Chat Completions field named in an error, as the Responses request calls it. Only the
    field itself: message and chat-tool indices are not those of the request's items and tools."""
    if param is None:
        return None
    head = re.split(r"[.\[]", param, maxsplit=1)[0]
    return CHAT_PARAM_NAMES.get(head, param)
