"""The Responses API and Anthropic's Messages API as bench/load.py's clients speak them.

load.py keeps every conversation as Chat Completions messages (a system message, user turns,
assistant turns with their `tool_calls`, `tool` results). Here each is sent the way that API's
own clients send it, and each API's stream is read back into load.py's Exchange:

- `/v1/responses`: the system prompt as `instructions`, the history as input items (messages
  with `input_text` / `output_text` parts, a call as a `function_call` item, its result as a
  `function_call_output`), `store: false` as Codex sends it. Events: `response.output_text.delta`,
  `response.output_item.added` / `response.function_call_arguments.delta` for calls, usage in
  `response.completed` (`input_tokens` sent, `input_tokens_details.cached_tokens` cached).
- `/v1/messages`: `system`, user and assistant turns with Anthropic blocks (a call as a
  `tool_use` block with its `input` object, its result as a `tool_result` block in the next
  user turn, before the question). Events: `content_block_start` / `content_block_delta`
  (`text_delta`, `input_json_delta`), usage in `message_start` and `message_delta`
  (`input_tokens + cache_read_input_tokens` sent, `cache_read_input_tokens` cached).

Both ask for what load.py's chat requests ask for: greedy, streamed, EOS ignored without tools
(llama.cpp's `ignore_eos`), a call forced with tools (`required` / `{"type": "any"}`).
Calls come back in Chat Completions' shape, so the next turn and the validation are shared.
"""

from __future__ import annotations

import json
import time
from typing import Any

RESPONSES_DONE = ("response.completed", "response.incomplete")  # a stream that ended well
RESPONSES_FAILED = ("response.failed", "error")


# --- request bodies ------------------------------------------------------------------------------

def _split_system(chat: list[dict]) -> tuple[str | None, list[dict]]:
    """The system prompt's text and the messages after it."""
    if chat and chat[0]["role"] == "system":
        return chat[0]["content"], chat[1:]
    return None, chat


def responses_body(chat: list[dict], max_tokens: int, model: str, tools: list[dict] | None = None) -> dict:
    """A streamed, greedy Responses request of the conversation: without tools EOS is ignored
    (every reply max_tokens long); with tools a call is required."""
    instructions, messages = _split_system(chat)
    body = {"model": model, "input": [item for message in messages for item in _input_items(message)],
            "max_output_tokens": max_tokens, "temperature": 0, "ignore_eos": not tools, "stream": True,
            "store": False}
    if instructions is not None:
        body["instructions"] = instructions
    if tools:
        body["tools"] = [{"type": "function", "name": tool["function"]["name"],
                          "description": tool["function"].get("description"),
                          "parameters": tool["function"]["parameters"]} for tool in tools]
        body["tool_choice"] = "required"
        body["parallel_tool_calls"] = False  # one call per reply, as the chat bodies ask
    return body


def _input_items(message: dict) -> list[dict]:
    """One chat message as Responses input items: a message item, and one item per call."""
    role, content = message["role"], message.get("content")
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"], "output": content}]
    calls = message.get("tool_calls") or []
    part_type = "output_text" if role == "assistant" else "input_text"
    items = [] if calls and not content else [{"type": "message", "role": role,
                                                "content": [{"type": part_type, "text": content or ""}]}]
    return items + [{"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                     "arguments": call["function"]["arguments"]} for call in calls]


def messages_body(chat: list[dict], max_tokens: int, model: str, tools: list[dict] | None = None) -> dict:
    """A streamed, greedy Anthropic Messages request of the conversation: without tools EOS is
    ignored (every reply max_tokens long); with tools a call is required."""
    system, messages = _split_system(chat)
    turns: list[dict] = []
    for message in messages:
        role, blocks = _anthropic_turn(message)
        if turns and turns[-1]["role"] == role == "user":  # tool results, then the next question
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    body = {"model": model, "messages": turns, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": not tools, "stream": True}
    if system is not None:
        body["system"] = system
    if tools:
        body["tools"] = [{"name": tool["function"]["name"], "description": tool["function"].get("description", ""),
                          "input_schema": tool["function"]["parameters"]} for tool in tools]
        body["tool_choice"] = {"type": "any", "disable_parallel_tool_use": True}  # one call per reply
    return body


def _anthropic_turn(message: dict) -> tuple[str, list[dict]]:
    """One chat message as (role, Anthropic blocks): a tool result is a user's tool_result block."""
    role, content = message["role"], message.get("content")
    if role == "tool":
        return "user", [{"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content}]
    calls = message.get("tool_calls") or []
    blocks = [] if calls and not content else [{"type": "text", "text": content or ""}]
    return role, blocks + [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                            "input": _arguments_object(call["function"]["arguments"])} for call in calls]


def _arguments_object(arguments: str) -> dict:
    """A call's arguments as the object a tool_use block holds ({} when the model's text was
    not a JSON object: it still goes back, as a client would send what it could read)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- reading the streams -------------------------------------------------------------------------

def _data_of(event: bytes) -> dict | None:
    """The JSON of one SSE event's data lines (the event's type is repeated in it)."""
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return json.loads(b"\n".join(lines)) if lines else None


def _note_content(exchange: Any, now: float) -> None:
    """A content event: text or a piece of a call, as a client's user would see it arrive."""
    exchange.content_times.append(now)
    if exchange.first_content_at is None:
        exchange.first_content_at = now


def _new_call(exchange: Any, call_id: str, name: str) -> None:
    exchange.tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}})


def take_responses_event(exchange: Any, event: bytes) -> bool:
    """Note one Responses API event; True when the response is done."""
    now = time.perf_counter()
    data = _data_of(event)
    kind = data.get("type") if data else None
    if kind == "response.output_text.delta":
        exchange.text += data["delta"]
        _note_content(exchange, now)
    elif kind == "response.output_item.added" and data["item"]["type"] == "function_call":
        _new_call(exchange, data["item"]["call_id"], data["item"]["name"])
        _note_content(exchange, now)
    elif kind == "response.function_call_arguments.delta":
        exchange.tool_calls[-1]["function"]["arguments"] += data["delta"]
        _note_content(exchange, now)
    elif kind in RESPONSES_DONE:
        usage = data["response"].get("usage") or {}
        exchange.prompt_tokens = usage.get("input_tokens", 0)
        exchange.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0) or 0
        exchange.completion_tokens = usage.get("output_tokens", 0)
        exchange.done_at = now
        return True
    elif kind in RESPONSES_FAILED:
        raise RuntimeError(f"stream error: {data.get('response', {}).get('error') or data}")
    return False


def take_messages_event(exchange: Any, event: bytes) -> bool:
    """Note one Anthropic Messages event; True at message_stop."""
    now = time.perf_counter()
    data = _data_of(event)
    kind = data.get("type") if data else None
    if kind == "content_block_start" and data["content_block"]["type"] == "tool_use":
        _new_call(exchange, data["content_block"]["id"], data["content_block"]["name"])
        _note_content(exchange, now)
    elif kind == "content_block_delta":
        delta = data["delta"]
        if delta["type"] == "text_delta":
            exchange.text += delta["text"]
            _note_content(exchange, now)
        elif delta["type"] == "input_json_delta":
            exchange.tool_calls[-1]["function"]["arguments"] += delta["partial_json"]
            _note_content(exchange, now)
    elif kind == "message_start":
        _take_anthropic_usage(exchange, data["message"].get("usage") or {})
    elif kind == "message_delta":
        _take_anthropic_usage(exchange, data.get("usage") or {})
    elif kind == "message_stop":
        exchange.done_at = now
        return True
    elif kind == "error":
        raise RuntimeError(f"stream error: {data.get('error')}")
    return False


def _take_anthropic_usage(exchange: Any, usage: dict) -> None:
    """Anthropic's usage, as far as this event gives it (message_start may carry the input
    counts, message_delta the final ones): input_tokens are those computed, so the prompt
    sent is input_tokens + cache_read_input_tokens."""
    if "input_tokens" in usage or "cache_read_input_tokens" in usage:
        cached = usage.get("cache_read_input_tokens") or 0
        sent = (usage.get("input_tokens") or 0) + cached
        if sent:
            exchange.prompt_tokens, exchange.cached_tokens = sent, cached
    if usage.get("output_tokens"):
        exchange.completion_tokens = usage["output_tokens"]
