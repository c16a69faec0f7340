"""The fields of one prompt line: their types, what they become, and the ones that cannot run.

Both input formats share these: a JSONL line carries them at its top, an OpenAI Batch line in
its body. A field of the wrong type, or one this runner cannot honour, is an ItemError naming
the field (`param`, in OpenAI's words), so the line fails alone with a reason a user can act on.
"""

from __future__ import annotations

import json
from typing import Any

from ..runner import SamplingParams
from ..runner.config import is_int, is_number
from ..runner.grammar import ConstraintError, check_constraint
from ..runner.request import CHAT_ROLES

MAX_CHOICES = 128
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's limit
# OpenAI's other names for the roles a chat template knows.
ROLE_ALIASES = {"developer": "system"}


class ItemError(ValueError):
    """One line's problem, said in words a user can act on; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


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
}
# Fields every line may carry besides the sampling fields.
COMMON_FIELDS = {"n", "response_format", "max_completion_tokens"}
# OpenAI body fields that change nothing here but appear in real files.
IGNORED_OPENAI_FIELDS = {
    "model", "user", "metadata", "store", "service_tier", "stream", "stream_options", "parallel_tool_calls",
    "prompt_cache_key", "safety_identifier", "reasoning_effort", "verbosity",
}
# OpenAI body fields this runner cannot honour, and why.
UNSUPPORTED_FIELDS = {
    "tools": "tool calling is not supported: the model's output is returned as text",
    "functions": "function calling is not supported: the model's output is returned as text",
    "function_call": "function calling is not supported: the model's output is returned as text",
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
        overrides["stop"] = tuple([overrides["stop"]] if isinstance(overrides["stop"], str) else overrides["stop"])
    if "logit_bias" in overrides:
        overrides["logit_bias"] = _logit_bias(overrides["logit_bias"])
    return overrides


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
    if body.get("tool_choice") not in (None, "none"):
        raise ItemError("field 'tool_choice' cannot be honoured: tool calling is not supported", "tool_choice")
    if body.get("modalities") not in (None, ["text"]):
        raise ItemError("field 'modalities' cannot be honoured: the model writes text only", "modalities")
    if body.get("echo"):
        raise ItemError("field 'echo' cannot be honoured: the prompt is not repeated in the output", "echo")
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise ItemError("field 'best_of' cannot be honoured: use 'n' for several completions", "best_of")


def completion_logprobs(value: Any) -> dict[str, Any]:
    """The completions API's logprobs: an integer, how many top alternatives to report."""
    if value is None:
        return {}
    if not is_int(value) or not 0 <= value <= MAX_COMPLETION_LOGPROBS:
        raise ItemError(f"'logprobs' must be an integer in [0, {MAX_COMPLETION_LOGPROBS}] for completions, "
                        f"got {json.dumps(value)}", "logprobs")
    return {"logprobs": True, "top_logprobs": value}


def chat_messages(value: Any) -> list[dict[str, str]]:
    """Chat messages as {role, content} strings: text parts joined by newlines, developer as
    system, names dropped. Tool messages and non-text parts fail, naming where they are."""
    if not isinstance(value, list) or not value:
        raise ItemError("'messages' must be a non-empty list of {role, content} objects", "messages")
    return [_chat_message(message, f"messages[{index}]") for index, message in enumerate(value)]


def _chat_message(message: Any, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise ItemError(f"{where} must be an object with 'role' and 'content'", where)
    role = message.get("role")
    if role in ("tool", "function"):
        raise ItemError(f"{where} has role {role!r}: tool results cannot be honoured without tool calling",
                        f"{where}.role")
    if not isinstance(role, str) or ROLE_ALIASES.get(role, role) not in CHAT_ROLES:  # a list cannot be looked up
        raise ItemError(f"{where} has role {json.dumps(role)}; expected one of "
                        f"{', '.join([*CHAT_ROLES, *ROLE_ALIASES])}", f"{where}.role")
    for name in ("tool_calls", "function_call", "audio"):
        if message.get(name) is not None:
            raise ItemError(f"{where}.{name} cannot be honoured: tool calling and audio are not supported",
                            f"{where}.{name}")
    unknown = sorted(set(message) - {"role", "content", "name", "refusal", "tool_calls", "function_call", "audio"})
    if unknown:
        raise ItemError(f"{where} has unknown field {unknown[0]!r}", f"{where}.{unknown[0]}")
    return {"role": ROLE_ALIASES.get(role, role), "content": _content_text(message.get("content"), f"{where}.content")}


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ItemError(f"{where} must be a string or a list of text parts", where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            if isinstance(kind, str):
                raise ItemError(f"{where}[{index}] is a {kind!r} part, which cannot be honoured: the model reads "
                                f"text only", f"{where}[{index}].type")
            raise ItemError(f"{where}[{index}] must be an object with a 'type'", f"{where}[{index}]")
        if not isinstance(part.get("text"), str):
            raise ItemError(f"{where}[{index}] text part needs a 'text' string", f"{where}[{index}].text")
        texts.append(part["text"])
    return "\n".join(texts)
