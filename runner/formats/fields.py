"""The fields of one prompt line: their types, what they become, and the ones that cannot run.

Both input formats share these: a JSONL line carries them at its top, an OpenAI Batch line in
its body. A field of the wrong type, or one this runner cannot honour, is an ItemError naming
the field (`param`, in OpenAI's words), so the line fails alone with a reason a user can act on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..config import SamplingParams, is_int, is_number
from ..sampling.grammar import ConstraintError, check_constraint
from ..request import CHAT_ROLES
from .item_error import ItemError
from .media_input import MAX_MEDIA_PER_REQUEST, PromptWithMedia, media_prompt, openai_media_part

MAX_CHOICES = 128
# OpenAI takes up to 4 stop strings; vLLM and llama.cpp clients send a few more. Every piece of
# output is matched against each, so both their number and their length are bounded.
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_COMPLETION_LOGPROBS = 20  # as vLLM allows (OpenAI's legacy API stopped at 5)
MAX_PROMPTS = 2048  # prompts in one completions body (OpenAI's limit)


def non_finite_path(value: Any) -> str | None:
    """Where a JSON value holds NaN or an infinity (Python's json reads `NaN`, `Infinity` and
    `1e999` as such floats), as a field path (`temperature`, `messages[0].x`; the value itself:
    ""); None when every number is finite. No field means anything at those values. Walked
    with a stack of its own: a body nested as deep as json reads it cannot overflow Python's."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        if isinstance(item, dict):
            children = [(f"{path}.{key}" if path else str(key), child) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(f"{path}[{index}]", child) for index, child in enumerate(item)]
        else:
            continue
        pending.extend(reversed(children))  # the first field first, as the body reads
    return None


def _is_stop(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value))


# Per-item sampling fields a prompt line may carry, and the JSON type each must have.
SAMPLING_FIELDS = {
    "max_tokens": (is_int, "an integer"),
    "temperature": (is_number, "a number"),
    "top_k": (is_int, "an integer"),
    "top_p": (is_number, "a number"),
    "min_p": (is_number, "a number"),
    "repeat_penalty": (is_number, "a number"),
    "min_tokens": (is_int, "an integer"),
    "presence_penalty": (is_number, "a number"),
    "frequency_penalty": (is_number, "a number"),
    "logit_bias": (lambda value: isinstance(value, dict), "an object of token ids to numbers"),
    "seed": (is_int, "an integer"),
    "stop": (_is_stop, "a string or a list of strings"),
    "ignore_eos": (lambda value: isinstance(value, bool), "true or false"),
    "logprobs": (lambda value: isinstance(value, bool), "true or false"),
    "top_logprobs": (is_int, "an integer"),
    "json_schema": (lambda value: isinstance(value, dict), "a JSON Schema object"),
    "grammar": (lambda value: isinstance(value, str), "GBNF grammar text"),
    "json_object": (lambda value: isinstance(value, bool), "true or false"),
    "strict_schema": (lambda value: isinstance(value, bool), "true or false"),
    "min_indent": (is_int, "an integer"),
    "newline_deadline_ms": (is_int, "an integer"),
    "reasoning_budget_message": (lambda value: isinstance(value, str), "a string"),  # llama-server's
}
# A reasoning budget's names: vLLM's, then llama-server's two (SamplingParams.reasoning_budget).
REASONING_BUDGET_FIELDS = ("thinking_token_budget", "reasoning_budget_tokens", "thinking_budget_tokens")
# Fields every line may carry besides the sampling fields.
COMMON_FIELDS = {"n", "response_format", "max_completion_tokens", "repetition_penalty", *REASONING_BUDGET_FIELDS}
# OpenAI body fields that change nothing here but appear in real files.
IGNORED_OPENAI_FIELDS = {
    "model", "user", "metadata", "store", "service_tier", "stream", "stream_options",
    "prompt_cache_key", "safety_identifier", "verbosity",
    "cache_prompt",  # llama-server's: the prefix cache is always on here
}
# OpenAI body fields this runner cannot honour, and why.
UNSUPPORTED_FIELDS = {
    "audio": "audio output is not supported: the model writes text",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "suffix": "insertion with a suffix is not supported",
}


def sampling_overrides(fields: dict[str, Any]) -> dict[str, Any]:
    """Check the per-item sampling fields' types; return them as SamplingParams keywords."""
    overrides = {}
    for name, value in fields.items():
        check, expected = SAMPLING_FIELDS[name]
        if value is None:
            continue
        if not check(value):
            raise ItemError(f"field {name!r} must be {expected}, got {json.dumps(value)}", name)
        overrides[name] = value
    if "stop" in overrides:
        overrides["stop"] = _stop_strings(overrides["stop"])
    if "logit_bias" in overrides:
        overrides["logit_bias"] = _logit_bias(overrides["logit_bias"])
    return overrides


def _stop_strings(value: str | list[str]) -> tuple[str, ...]:
    """`stop` as a tuple, within MAX_STOP_STRINGS strings of at most MAX_STOP_LENGTH characters."""
    strings = tuple([value] if isinstance(value, str) else value)
    if len(strings) > MAX_STOP_STRINGS:
        raise ItemError(f"'stop' has {len(strings)} strings; at most {MAX_STOP_STRINGS} are allowed", "stop")
    longest = max(strings, key=len, default="")
    if len(longest) > MAX_STOP_LENGTH:
        raise ItemError(f"'stop' has a string of {len(longest)} characters; at most {MAX_STOP_LENGTH} are allowed",
                        "stop")
    return strings


def _logit_bias(value: dict[str, Any]) -> dict[int, float]:
    """OpenAI's logit_bias: token ids as strings (JSON keys), each with a bias in [-100, 100]."""
    bias = {}
    for key, amount in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ItemError(f"logit_bias keys must be token ids, got {json.dumps(key)}", "logit_bias")
        if not is_number(amount):
            raise ItemError(f"logit_bias of token {key} must be a number, got {json.dumps(amount)}", "logit_bias")
        bias[int(key)] = amount
    return bias


def response_format_overrides(value: Any) -> dict[str, Any]:
    """OpenAI's response_format as SamplingParams keywords: text (no constraint), json_object,
    or json_schema with its schema. OpenAI's `strict: true` asks that the output follow the
    schema exactly, refusing schemas it cannot enforce: strict_schema; false or absent leaves
    the line's default (approximate what cannot be enforced, and validate the output)."""
    if not isinstance(value, dict):
        raise ItemError("'response_format' must be an object with a 'type'", "response_format")
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ItemError("response_format json_schema needs 'json_schema': {'name', 'schema': {...}}",
                            "response_format.json_schema.schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ItemError(f"response_format json_schema 'strict' must be true or false, got {json.dumps(strict)}",
                            "response_format.json_schema.strict")
        return {"json_schema": spec["schema"]} | ({} if strict is None else {"strict_schema": strict})
    raise ItemError(f"response_format type must be text, json_object or json_schema, got {json.dumps(kind)}",
                    "response_format.type")


def check_constraint_compiles(sampling: SamplingParams, param: str) -> None:
    """Compile the line's schema or grammar now, so a bad one fails before anything runs."""
    try:
        check_constraint(sampling)
    except ConstraintError as error:
        raise ItemError(str(error), param) from None


def constraint_param(fields: dict[str, Any]) -> str:
    """The field that carried a line's constraint, for its error."""
    if "response_format" in fields:
        return "response_format"
    return next((name for name in ("json_schema", "grammar", "json_object") if name in fields), "response_format")


def choice_count(value: Any) -> int:
    if not is_int(value) or not 1 <= value <= MAX_CHOICES:
        raise ItemError(f"'n' must be an integer in [1, {MAX_CHOICES}], got {json.dumps(value)}", "n")
    return value


def reject_unsupported(body: dict[str, Any]) -> None:
    """OpenAI fields that cannot be honoured fail the line, naming the field."""
    for name, reason in UNSUPPORTED_FIELDS.items():
        if body.get(name) is not None:
            raise ItemError(f"field {name!r} cannot be honoured: {reason}", name)
    if body.get("modalities") not in (None, ["text"]):
        raise ItemError("field 'modalities' cannot be honoured: the model writes text only", "modalities")
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise ItemError("field 'best_of' cannot be honoured: use 'n' for several completions", "best_of")


def completion_logprobs(value: Any, echo: bool = False) -> dict[str, Any]:
    """The completions API's logprobs: an integer, how many top alternatives to report (with
    echo, for every prompt token too: an echoed prompt is computed whole, for its tokens)."""
    if value is None:
        return {"prompt_logprobs": 0} if echo else {}
    if not is_int(value) or not 0 <= value <= MAX_COMPLETION_LOGPROBS:
        raise ItemError(f"'logprobs' must be an integer in [0, {MAX_COMPLETION_LOGPROBS}] for completions, "
                        f"got {json.dumps(value)}", "logprobs")
    return {"logprobs": True, "top_logprobs": value} | ({"prompt_logprobs": value} if echo else {})


def completion_prompts(value: Any) -> list[str | tuple[int, ...] | PromptWithMedia]:
    """The completions API's prompt: a string, its token ids, llama-server's {"prompt_string",
    "multimodal_data"}, or a list of those (each its own choices); ItemError naming the prompt
    that is not."""
    if isinstance(value, (str, dict)) or _is_token_list(value):
        return [_one_prompt(value, "prompt")]
    if not isinstance(value, list) or not value:
        raise ItemError("'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt")
    if len(value) > MAX_PROMPTS:
        raise ItemError(f"'prompt' holds {len(value)} prompts; one body takes at most {MAX_PROMPTS}", "prompt")
    return [_one_prompt(prompt, f"prompt[{index}]") for index, prompt in enumerate(value)]


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(token, int) and not isinstance(token, bool)
                                                          for token in value)


def _one_prompt(value: Any, where: str) -> str | tuple[int, ...] | PromptWithMedia:
    if isinstance(value, dict):
        return media_prompt(value, where)
    if isinstance(value, str):
        if not value.strip():
            raise ItemError(f"'{where}' must be a non-empty string", "prompt")
        return value
    if _is_token_list(value):
        negative = next((token for token in value if token < 0), None)
        if negative is not None:
            raise ItemError(f"'{where}' holds the token id {negative}; token ids are >= 0", "prompt")
        return tuple(value)
    raise ItemError(f"'{where}' must be a non-empty string or a non-empty list of token ids", "prompt")


def echo_fields(body: dict[str, Any], n: int) -> tuple[bool, bool, dict[str, Any]]:
    """The completions API's echo: whether each choice repeats its prompt, whether only the
    prompt is wanted (max_tokens 0: scoring; run as one token, left out of the answer), and the
    body to run."""
    echo = body.get("echo", False)
    if echo is None:
        echo = False
    if not isinstance(echo, bool):
        raise ItemError(f"'echo' must be true or false, got {json.dumps(echo)}", "echo")
    if not echo:
        return False, False, body
    if n != 1:
        raise ItemError("'echo' takes n = 1: every choice of a prompt would repeat the same scores", "n")
    if body.get("max_tokens") == 0:
        return True, True, body | {"max_tokens": 1}
    return True, False, body


def chat_messages(value: Any, media_root: Path | None = None) -> list[dict[str, Any]]:
    """Chat messages as the engine takes them: {role, content} with content a string or a list
    of parts, names dropped; an assistant's `tool_calls` (content may then be null) and a tool
    result's `tool_call_id` kept; the legacy `function_call` and `function` role mapped onto
    them. Images and audio (image_url, input_audio parts) become {"type": "image" | "audio",
    "data"} parts, read from data URLs, or from files under media_root where one is given
    (media_input.py). Unknown parts and fields fail, naming where they are."""
    if not isinstance(value, list) or not value:
        raise ItemError("'messages' must be a non-empty list of {role, content} objects", "messages")
    messages = [_chat_message(message, f"messages[{index}]", media_root) for index, message in enumerate(value)]
    count = sum(1 for message in messages if isinstance(message.get("content"), list)
                for part in message["content"] if part["type"] != "text")
    if count > MAX_MEDIA_PER_REQUEST:
        raise ItemError(f"'messages' hold {count} images or audio; at most {MAX_MEDIA_PER_REQUEST} are taken", "messages")
    return messages


_MESSAGE_KEYS = {"role", "content", "name", "refusal", "tool_calls", "tool_call_id", "function_call", "audio",
                 "reasoning_content"}


def _chat_message(message: Any, where: str, media_root: Path | None) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ItemError(f"{where} must be an object with 'role' and 'content'", where)
    role = message.get("role")
    if not isinstance(role, str) or (role not in CHAT_ROLES and role != "function"):
        raise ItemError(f"{where} has role {json.dumps(role)}; expected one of {', '.join(CHAT_ROLES)}",
                        f"{where}.role")
    if message.get("audio") is not None:
        raise ItemError(f"{where}.audio cannot be honoured: an assistant's audio is not read back", f"{where}.audio")
    unknown = sorted(set(message) - _MESSAGE_KEYS)
    if unknown:
        raise ItemError(f"{where} has unknown field {unknown[0]!r}", f"{where}.{unknown[0]}")
    if role in ("tool", "function"):
        return _tool_result(message, where, media_root)
    calls = _assistant_calls(message, where) if role == "assistant" else None
    content = message.get("content")
    if content is None and calls:
        converted_calls: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
            converted_calls["reasoning_content"] = message["reasoning_content"]
        return converted_calls
    converted: dict[str, Any] = {"role": role,
                                 "content": _content_text(content, f"{where}.content", media_root)}
    if calls:
        converted["tool_calls"] = calls
    reasoning = message.get("reasoning_content")
    if role == "assistant" and isinstance(reasoning, str) and reasoning:
        # A thinking model's template renders it back where it keeps reasoning (Qwen3: the
        # turns of the current tool loop), so the next prompt starts with the tokens it wrote.
        converted["reasoning_content"] = reasoning
    return converted


def _tool_result(message: dict[str, Any], where: str, media_root: Path | None) -> dict[str, Any]:
    """A tool's result: {"role": "tool", "tool_call_id", "content"}; the legacy
    {"role": "function", "name", "content"} answers the call named after its function."""
    call_id = message.get("tool_call_id") if message["role"] == "tool" else message.get("name")
    field = "tool_call_id" if message["role"] == "tool" else "name"
    if not isinstance(call_id, str) or not call_id:
        raise ItemError(f"{where} is a tool result and needs a {field!r} string", f"{where}.{field}")
    result: dict[str, Any] = {"role": "tool", "tool_call_id": call_id,
                              "content": _content_text(message.get("content") or "", f"{where}.content", media_root)}
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    return result


def _assistant_calls(message: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """An assistant's calls as [{"id", "type": "function", "function": {"name", "arguments"}}]."""
    if message.get("function_call") is not None:  # the legacy single call: its id is its name
        call = message["function_call"]
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ItemError(f"{where}.function_call must be {{'name', 'arguments'}}", f"{where}.function_call")
        return [{"id": call["name"], "type": "function",
                 "function": {"name": call["name"], "arguments": _arguments(call.get("arguments"),
                                                                            f"{where}.function_call.arguments")}}]
    calls = message.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise ItemError(f"{where}.tool_calls must be a list of calls", f"{where}.tool_calls")
    return [_assistant_call(call, f"{where}.tool_calls[{index}]") for index, call in enumerate(calls)] or None


def _assistant_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ItemError(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                        f"{where}.function")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ItemError(f"{where}.id must be a string", f"{where}.id")
    return {"id": call_id or function["name"], "type": "function",
            "function": {"name": function["name"], "arguments": _arguments(function.get("arguments"),
                                                                           f"{where}.function.arguments")}}


def _arguments(value: Any, where: str) -> str:
    """A call's arguments as JSON text, kept verbatim when given as text (OpenAI's shape)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # as llama-server writes it
    raise ItemError(f"{where} must be a JSON object given as text", where)


def _content_text(content: Any, where: str, media_root: Path | None = None) -> str | list[dict[str, Any]]:
    """A message's content: its text, or its parts as they came: text parts (the template reads
    them as parts where it can; elsewhere they are joined by newlines, as llama-server joins
    them), images and audio as {"type", "data"}."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ItemError(f"{where} must be a string or a list of parts", where)
    parts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ItemError(f"{where}[{index}] must be an object with a 'type'", f"{where}[{index}]")
        if kind != "text":
            parts.append(openai_media_part(part, f"{where}[{index}]", media_root))
            continue
        if not isinstance(part.get("text"), str):
            raise ItemError(f"{where}[{index}] text part needs a 'text' string", f"{where}[{index}].text")
        parts.append({"type": "text", "text": part["text"]})
    return parts
