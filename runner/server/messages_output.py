"""A chat.completion as an Anthropic Message: its content blocks, stop reason and usage.

Part of Anthropic's Messages API, translated at the door onto the Chat Completions path
(multiseq.server.messages).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ApiError
from .messages_request import MessagesRequest

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # "stop": end_turn or stop_sequence
TOOL_USE_ID_PREFIX = "toolu_"
MESSAGE_ID_PREFIX = "msg_"


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
