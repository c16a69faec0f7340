"""Ollama's request bodies translated onto the Chat Completions (and, for a raw /api/generate,
the Completions) path: its messages, tools, `format`, `think` and `options`.

Ollama's fields as its API documents them: a message's `images` (base64, no data URL), its
`thinking`, calls whose `arguments` are objects and results named by `tool_name` (no ids: each
result answers the earliest open call of that name); `options` holds the sampling settings
(num_predict, temperature, top_k, top_p, min_p, stop, seed, repeat_penalty, ...), and the ones
that size or place a model (num_ctx, num_gpu, num_thread, ...) are read by the server's own
flags instead, so they are left out, as Ollama leaves out an option a model does not take.
Unknown fields are left out too, as Ollama does. A field of the wrong type is a 400 naming it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import INVALID_REQUEST, ApiError

# Ollama option -> the Chat Completions field it is.
SAMPLING_OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                    "min_p": "min_p", "stop": "stop", "seed": "seed", "repeat_penalty": "repeat_penalty",
                    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
THINK_LEVELS = ("low", "medium", "high")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
ROLES = ("system", "user", "assistant", "tool")


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param)


@dataclass(frozen=True)
class OllamaCall:
    """One Ollama request, translated: the body the chat path takes, whether it is a chat (else
    a raw completion), whether it streams (Ollama's default), and the model named."""

    body: dict[str, Any]
    is_chat: bool
    stream: bool
    model: str


def chat_call(body: dict[str, Any]) -> OllamaCall:
    """POST /api/chat's body, translated."""
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise bad_request("'messages' must be a list of messages", "messages")
    chat = {"messages": chat_messages(messages)}
    if body.get("tools"):
        chat["tools"] = tools_of(body["tools"])
    return OllamaCall(chat | common_fields(body), True, streams(body), model_of(body))


def generate_call(body: dict[str, Any], suffix_prompt: list[int] | None = None) -> OllamaCall:
    """POST /api/generate's body, translated: the prompt as a user message (after `system`)
    rendered with the model's template, or with `raw` (or a `suffix`, laid out for fill-in-the-
    middle in `suffix_prompt`) as the model's whole input."""
    if body.get("template"):
        raise bad_request("'template' is not taken: the prompt is rendered with the model's own chat template "
                          "(send raw: true with a prompt you formatted yourself)", "template")
    prompt = text_field(body, "prompt")
    if suffix_prompt is not None:
        return OllamaCall({"prompt": suffix_prompt} | common_fields(body), False, streams(body), model_of(body))
    if body.get("raw") is True:
        if body.get("images"):
            raise bad_request("'images' need a rendered prompt: leave 'raw' out to send them", "images")
        return OllamaCall({"prompt": prompt} | common_fields(body), False, streams(body), model_of(body))
    messages = [{"role": "system", "content": text_field(body, "system")}] if body.get("system") else []
    messages.append({"role": "user", "content": prompt, **({"images": body["images"]} if body.get("images") else {})})
    return OllamaCall({"messages": chat_messages(messages)} | common_fields(body), True, streams(body), model_of(body))


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must name the model", "model")
    return model


def streams(body: dict[str, Any]) -> bool:
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    return stream


def text_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name) or ""
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", name)
    return value


def common_fields(body: dict[str, Any]) -> dict[str, Any]:
    """What /api/chat and /api/generate share: options, format, think, and the stream."""
    fields = options_of(body.get("options")) | format_of(body.get("format")) | think_of(body.get("think"))
    return fields | {"stream": streams(body)} | ({"stream_options": {"include_usage": True}} if streams(body) else {})


def options_of(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise bad_request("'options' must be an object such as {\"temperature\": 0}", "options")
    fields = {SAMPLING_OPTIONS[name]: value for name, value in options.items() if name in SAMPLING_OPTIONS}
    if isinstance(fields.get("max_tokens"), int) and not isinstance(fields["max_tokens"], bool) \
            and fields["max_tokens"] < 0:
        del fields["max_tokens"]  # -1: no limit, -2: fill the context; both end where the slot's window does
    return fields


def format_of(value: Any) -> dict[str, Any]:
    """`format`: "json" (any JSON object) or a JSON schema the answer follows."""
    if value in (None, ""):
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}}
    raise bad_request("'format' must be \"json\" or a JSON schema object", "format")


def think_of(value: Any) -> dict[str, Any]:
    """`think`: true or false switches the template's thinking; a level also sets its effort."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"chat_template_kwargs": {"enable_thinking": value}}
    if value in THINK_LEVELS:
        return {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": value}
    raise bad_request(f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}", "think")


def tools_of(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise bad_request("'tools' must be a list of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    return [{"type": "function", **tool} if "type" not in tool else tool for tool in tools]


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as Chat Completions messages: calls given ids, results matched to them."""
    converted, open_calls = [], []  # open_calls: (id, name) of calls not yet answered, in order
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"'{where}' must be a message with a role ({', '.join(ROLES)})", where)
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise bad_request(f"'{where}.content' must be a string", f"{where}.content")
        role = message["role"]
        chat: dict[str, Any] = {"role": role, "content": content}
        if message.get("images"):
            chat["content"] = [{"type": "text", "text": content}, *_image_parts(message["images"], where)]
        if role == "assistant":
            if message.get("thinking"):
                chat["reasoning_content"] = message["thinking"]
            calls = _calls_of(message.get("tool_calls") or [], index, where)
            if calls:
                chat["tool_calls"] = calls
                open_calls = [(call["id"], call["function"]["name"]) for call in calls]
        elif role == "tool":
            answered = next((pair for pair in open_calls if message.get("tool_name") in (None, pair[1])), None)
            if answered is None:
                raise bad_request(f"'{where}' is a tool result, but no call before it is waiting for one", where)
            open_calls.remove(answered)
            chat["tool_call_id"] = answered[0]
        converted.append(chat)
    return converted


def _calls_of(calls: Any, message_index: int, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"'{where}.tool_calls' must be a list", f"{where}.tool_calls")
    converted = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"'{where}.tool_calls[{number}]' must be {{\"function\": {{\"name\": ..., "
                              f"\"arguments\": {{...}}}}}}", f"{where}.tool_calls")
        arguments = function.get("arguments") or {}
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        converted.append({"id": f"call_{message_index}_{number}", "type": "function",
                          "function": {"name": function["name"], "arguments": text}})
    return converted


def _image_parts(images: Any, where: str) -> list[dict[str, Any]]:
    """Base64 images as image_url parts (their format is read from their bytes)."""
    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        raise bad_request(f"'{where}.images' must be a list of base64 strings", f"{where}.images")
    return [{"type": "image_url", "image_url": {"url": "data:;base64," + image}} for image in images]


def keep_alive_of(value: object) -> float | None:
    """`keep_alive` in seconds: a number of seconds or a duration ("5m", "1h30m", "90s"); a
    negative one keeps the model loaded (inf), 0 unloads it once idle; None when not given."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"-?(\d+(\.\d+)?(ms|h|m|s)?)+", value.strip()):
        text = value.strip()
        parts = DURATION_PART.findall(text.lstrip("-"))
        seconds = sum(float(number) * DURATION_SECONDS[unit] for number, unit in parts) if parts \
            else float(text.lstrip("-"))
        seconds = -seconds if text.startswith("-") else seconds
    else:
        raise bad_request("'keep_alive' must be a number of seconds or a duration such as \"5m\"", "keep_alive")
    return math.inf if seconds < 0 else seconds
