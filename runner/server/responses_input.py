"""The Responses API's input items: checked and normalized (with ids, as they are stored and
listed), and turned into Chat Completions messages.

Part of the Responses API's translation onto the Chat Completions path (multiseq.server.responses).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from ..formats.item_error import ItemError
from ..formats.media_input import image_bytes
from .errors import INVALID_REQUEST, ApiError

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TEXT_PART_TYPES = ("input_text", "output_text")
# Input items the model never reads: reasoning comes back from earlier turns (often encrypted).
SKIPPED_ITEM_TYPES = ("reasoning",)


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: `resp_...`, `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def bad_request(param: str, message: str) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param)


def normalize_input(value: Any) -> list[dict[str, Any]]:
    """The request's input as items in one shape (what is stored and listed by
    GET /v1/responses/{id}/input_items): a string is one user message; every item gets an
    id; message content becomes a list of text parts."""
    if isinstance(value, str):
        return [_message_item("user", [text_part("input_text", value)])]
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
        parts = [text_part(default_type, content)]
    elif isinstance(content, list):
        parts = [_content_part(part, f"{where}.content[{index}]") for index, part in enumerate(content)]
    else:
        raise bad_request(f"{where}.content", f"{where}.content must be a string or a list of content parts.")
    return _message_item(role, parts, item.get("id") if isinstance(item.get("id"), str) else None)


def _content_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image":
        return _image_part(part, where)
    if kind not in TEXT_PART_TYPES:
        if isinstance(kind, str):
            raise bad_request(f"{where}.type", f"{where} is an {json.dumps(kind)} part, which this server cannot "
                                               f"honour: the parts are input_text, output_text and input_image.")
        raise bad_request(where, f"{where} must be an object with a 'type'.")
    if not isinstance(part.get("text"), str):
        raise bad_request(f"{where}.text", f"{where}.text must be a string.")
    return text_part(kind, part["text"])


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An input_image part with its image as a data URL (file ids name nothing stored here),
    checked here so that an error names the part's own field."""
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}.image_url", f"{where}.image_url must be the image as a data URL "
                                                f"(data:image/png;base64,...); file_id is not taken.")
    try:
        image_bytes(url, f"{where}.image_url")
    except ItemError as error:
        raise bad_request(error.param or f"{where}.image_url", f"{error}.") from None
    return {"type": "input_image", "image_url": url, "detail": part.get("detail", "auto")}


def text_part(kind: str, text: str) -> dict[str, Any]:
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


def message_text(item: dict[str, Any]) -> str | list[dict[str, Any]]:
    """A message item's content for the chat path: its text parts joined by newlines, as the
    chat path joins parts; with images, the parts in order (the chat path joins them alike)."""
    if not any(part["type"] == "input_image" for part in item["content"]):
        return "\n".join(part["text"] if "text" in part else part["refusal"] for part in item["content"])
    return [{"type": "image_url", "image_url": {"url": part["image_url"]}} if part["type"] == "input_image"
            else {"type": "text", "text": part["text"] if "text" in part else part["refusal"]}
            for part in item["content"]]
