"""A chat completion as a Responses API Response object: its status, output items and usage.

Part of the Responses API's translation onto the Chat Completions path (multiseq.server.responses).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .responses_input import new_id, text_part
from .responses_request import ResponsesRequest


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
        "output_tokens_details": {"reasoning_tokens": (chat_usage.get("completion_tokens_details") or {}).get(
            "reasoning_tokens", 0)},
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
            "content": [text_part("output_text", text)]}


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
