"""A Messages API body translated into a Chat Completions body (`translate_request`), or an
ApiError naming the bad field.

Part of Anthropic's Messages API, translated at the door onto the Chat Completions path
(multiseq.server.messages).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..formats.item_error import ItemError
from ..formats.media_input import image_bytes
from ..tools.types import Tool
from .errors import ApiError

# Between text blocks that become one Chat Completions content string: a newline, as the Chat
# Completions path joins text parts and the Responses API joins input_text parts, so that one
# conversation renders to the same prompt tokens (and hits the same cache) through every API.
BLOCK_SEPARATOR = "\n"
TOOL_ERROR_PREFIX = "Error: "  # Chat Completions tool messages have no is_error: the text says it
# Blocks a local text model cannot read: refused by name rather than silently dropped.
UNREADABLE_BLOCKS = ("document",)
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
    "disabled"}) as the switch thinking templates read (enable_thinking), and its budget as the
    reasoning budget: past N thinking tokens the block is closed and the answer follows."""
    if value is None:
        return {}
    if not isinstance(value, dict) or value.get("type") not in ("enabled", "disabled", "adaptive"):
        raise invalid("thinking", "must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}")
    thinks = value["type"] != "disabled"
    fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": thinks, "thinking": thinks}}
    budget = value.get("budget_tokens")
    if thinks and budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise invalid("thinking.budget_tokens", "must be a whole number of tokens")
        fields["reasoning_budget_tokens"] = budget
    return fields


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
            raise invalid(f"{path}[{index}].type", f"'{kind}' blocks are not supported: send a document's text, "
                                                    "or its pages as images")
    return content


def _user_messages(blocks: list[dict[str, Any]], path: str, tool_uses: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, in order, then its text as one user
    message (Anthropic puts the results first; a turn of results only has no user message)."""
    results, parts = [], []
    for index, block in enumerate(blocks):
        kind, where = block["type"], f"{path}[{index}]"
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, where)})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "tool_result":
            results.append(_tool_message(block, where, tool_uses))
        elif kind not in DROPPED_BLOCKS:
            raise invalid(f"{where}.type", f"'{kind}' blocks are not allowed in a user message")
    if parts or not results:
        results.append({"role": "user", "content": _content_of(parts)})
    return results


def _content_of(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text blocks as one text (a newline between two); with images, the parts in order, which
    the chat path joins the same way around them."""
    if any(part["type"] != "text" for part in parts):
        return parts
    return BLOCK_SEPARATOR.join(part["text"] for part in parts)


def _image_part(block: dict[str, Any], path: str) -> dict[str, Any]:
    """An image block ({"source": {"type": "base64", "media_type", "data"}}) as a chat part."""
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise invalid(f"{path}.source", "an image's source must be base64 data ({'type': 'base64', 'media_type', "
                                        "'data'}): this server fetches nothing")
    media_type, data = source.get("media_type"), source.get("data")
    if not isinstance(media_type, str) or not isinstance(data, str) or not data:
        raise invalid(f"{path}.source", "an image's source needs a 'media_type' and base64 'data'")
    url = f"data:{media_type};base64,{data}"
    where = f"{path}.source.data"
    try:  # checked here, so that an error names the block's own field
        image_bytes(url, where)
    except ItemError as error:
        raise invalid(where, str(error).removeprefix(where).strip()) from None
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: dict[str, Any], path: str, tool_uses: dict[str, str]) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise invalid(f"{path}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
    if tool_use_id not in tool_uses:
        raise invalid(f"{path}.tool_use_id", f"unexpected tool_use_id {json.dumps(tool_use_id)}: each tool_result "
                                             "must answer a tool_use block of the previous (assistant) message")
    content = block.get("content", "")
    if isinstance(content, list):  # text and images (a tool that reads an image file returns one)
        content = _content_of([_image_part(part, f"{path}.content[{index}]") if isinstance(part, dict) and
                               part.get("type") == "image" else {"type": "text", "text": _text_of(
                                   part, f"{path}.content[{index}]")} for index, part in enumerate(content)])
    elif not isinstance(content, str):
        raise invalid(f"{path}.content", "must be a string or a list of text and image blocks")
    is_error = block.get("is_error", False)
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid(f"{path}.is_error", "must be true or false")
    if is_error:
        content = TOOL_ERROR_PREFIX + content if isinstance(content, str) else \
            [{"type": "text", "text": TOOL_ERROR_PREFIX}, *content]
    return {"role": "tool", "tool_call_id": tool_use_id, "content": content}


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
