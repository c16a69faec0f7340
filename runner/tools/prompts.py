"""Tools and tool messages in the prompt, for templates that know tools and for those that don't.

A template that knows tools (Hermes/Qwen, Llama 3.x, Mistral: recognised by the call format its
text writes) renders them itself, with the messages shaped as llama-server shapes them
(multiseq.llama.template_input). Any other template (SmolLM2's, Gemma's, llama.cpp's built-ins) gets the generic
format: the tools are described in a system part, a call the assistant made is written into its
content exactly as the grammar had the model write it (`{"tool_calls": [...]}`, the arguments
verbatim), and a tool's result becomes a user message holding it as JSON. The system part is the
same for every tool_choice, so a conversation whose turns change the choice keeps its prefix.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from ..llama.template_input import content_text
from .families.hermes import CALL_CLOSE as HERMES_CLOSE
from .families.hermes import CALL_OPEN as HERMES_OPEN
from .families.mistral import CALLS as MISTRAL_OPEN
from .types import Tool, ToolFormat

GENERIC_INSTRUCTIONS = (
    "You can call the following tools. To call tools, answer with only one JSON object, with nothing "
    "before or after it:\n"
    '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments, as the tool\'s parameters say>}}]}\n'
    "Otherwise, answer in plain text. The tools:\n")


def thinks(template_source: str | None) -> bool:
    """Whether the template's model reasons in <think>...</think> before it answers."""
    return bool(template_source) and "<think>" in template_source


def tools_description(tools: Sequence[Tool]) -> str:
    """The tools as JSON, one per line: name, description, parameters. Kept short: a
    description's first paragraph (at most MAX_DESCRIPTION characters), and the parameters
    without their annotations (descriptions, titles, examples). Agents send pages of tool
    documentation (Claude Code's 24 tools come to 16,000 tokens whole, twice a small model's
    window), which a template that knows no tools was never trained to read; the grammar, not
    the description, keeps the calls valid."""
    lines = []
    for tool in tools:
        spec: dict[str, Any] = {"name": tool.name}
        if tool.description:
            spec["description"] = short_description(tool.description)
        spec["parameters"] = without_annotations(tool.schema)
        lines.append(json.dumps(spec, ensure_ascii=False))
    return "\n".join(lines)


MAX_DESCRIPTION = 400  # characters of a tool's description in the generic format's system part
_ANNOTATION_KEYWORDS = frozenset({"description", "title", "examples", "example", "$comment", "deprecated"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_VALUES = frozenset({"items", "additionalProperties", "not", "contains", "if", "then", "else",
                            "propertyNames", "additionalItems", "unevaluatedProperties", "unevaluatedItems"})


def short_description(text: str) -> str:
    """A description's first paragraph, cut at a sentence end (or a word) within MAX_DESCRIPTION."""
    paragraph = text.strip().split("\n\n", 1)[0].strip()
    if len(paragraph) <= MAX_DESCRIPTION:
        return paragraph
    cut = paragraph[:MAX_DESCRIPTION]
    end = max(cut.rfind(". "), cut.rfind(".\n"))
    return cut[:end + 1] if end > 0 else cut.rsplit(" ", 1)[0] + " ..."


def without_annotations(schema: Any) -> Any:
    """A JSON schema without the keywords that only annotate it (at any depth); property names
    that happen to be such words are kept."""
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATION_KEYWORDS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            kept[key] = {name: without_annotations(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            kept[key] = [without_annotations(sub) for sub in value]
        elif key in _SCHEMA_VALUES:
            kept[key] = without_annotations(value)
        else:
            kept[key] = value
    return kept


def call_text(tool_format: ToolFormat, calls: Sequence[dict[str, Any]]) -> str:
    """Calls (OpenAI's {"id", "function": {"name", "arguments"}}) written as the format's grammar
    has the model write them, the arguments verbatim: what a re-rendered turn must hold to
    match the tokens generated for it."""
    pairs = [(call["function"]["name"], _arguments_text(call["function"].get("arguments"))) for call in calls]
    if tool_format is ToolFormat.HERMES:
        return "\n".join(f'{HERMES_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}'
                         f"\n{HERMES_CLOSE}" for name, arguments in pairs)
    key = "parameters" if tool_format is ToolFormat.LLAMA3 else "arguments"
    objects = [f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{key}": {arguments}}}' for name, arguments in pairs]
    if tool_format is ToolFormat.LLAMA3:
        return "; ".join(objects)
    if tool_format is ToolFormat.MISTRAL:
        return f"{MISTRAL_OPEN}[{', '.join(objects)}]"
    return f'{{"tool_calls": [{", ".join(objects)}]}}'


def _arguments_text(arguments: Any) -> str:
    """A call's arguments as JSON text: kept verbatim when given as text (as OpenAI clients send
    back what they got), else serialized."""
    if isinstance(arguments, str):
        return arguments.strip() or "{}"
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def generic_messages(messages: Sequence[dict[str, Any]], tools: Sequence[Tool] | None,
                     tool_format: ToolFormat) -> list[dict[str, str]]:
    """Messages any template renders (role and content only): the tools described in the
    system message, calls written into the assistant's content, a turn's tool results as one
    user message."""
    names = _call_names(messages)
    converted = _results_merged(messages, [_generic_message(message, names, tool_format) for message in messages])
    if not tools:
        return converted
    description = GENERIC_INSTRUCTIONS + tools_description(tools)
    if converted and converted[0]["role"] in ("system", "developer"):
        converted[0] = {"role": converted[0]["role"],
                        "content": f"{content_text(converted[0]['content'])}\n\n{description}"}
    else:
        converted.insert(0, {"role": "system", "content": description})
    return converted


def _results_merged(messages: Sequence[dict[str, Any]], converted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results of a turn of calls, and the user's words right after them, as one user message
    (a line each): a template that insists on user and assistant turns in turn (Gemma's) takes
    two results, or a result and a question, so."""
    merged: list[dict[str, Any]] = []
    after_results = False
    for original, message in zip(messages, converted):
        if after_results and original["role"] in ("tool", "user"):
            joined = f"{content_text(merged[-1]['content'])}\n{content_text(message['content'])}"
            merged[-1] = {"role": "user", "content": joined}
        else:
            merged.append(message)
        after_results = original["role"] == "tool" or (after_results and original["role"] == "user")
    return merged


def _call_names(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The function name of every call id in the conversation (tool messages name only the id)."""
    return {call.get("id"): call["function"]["name"] for message in messages
            for call in message.get("tool_calls") or () if call.get("id")}


def _generic_message(message: dict[str, Any], names: dict[str, str], tool_format: ToolFormat) -> dict[str, Any]:
    content = message.get("content") or ""
    if isinstance(content, list) and (message["role"] == "tool" or message.get("tool_calls")):
        content = content_text(content)
    if message["role"] == "tool":
        name = message.get("name") or names.get(message.get("tool_call_id"), "")
        return {"role": "user", "content": json.dumps({"tool_response": {"name": name, "content": content}},
                                                      ensure_ascii=False)}
    if message.get("tool_calls"):
        calls = call_text(tool_format, message["tool_calls"])
        return {"role": "assistant", "content": f"{content}\n{calls}" if content else calls}
    return {"role": message["role"], "content": content}


_ALPHANUMERIC = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def with_call_ids_of_length(messages: Sequence[dict[str, Any]], length: int) -> list[dict[str, Any]]:
    """The messages with every call id that is not `length` alphanumeric characters renamed to
    one that is (Mistral's templates refuse others): the same id always gets the same name, so
    a call and its result still match and the next turn renders to the same prompt."""
    def renamed(call_id: Any) -> Any:
        if not isinstance(call_id, str) or (len(call_id) == length and call_id.isascii() and call_id.isalnum()):
            return call_id
        number = int.from_bytes(hashlib.blake2b(call_id.encode("utf-8"), digest_size=16).digest(), "big")
        return "".join(_ALPHANUMERIC[(number // len(_ALPHANUMERIC) ** place) % len(_ALPHANUMERIC)]
                       for place in range(length))

    converted = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [{**call, "id": renamed(call.get("id"))} for call in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = renamed(message["tool_call_id"])
        converted.append(message)
    return converted


def call_id_of_length(length: int) -> Callable[[int], str]:
    """Call ids of `length` random alphanumeric characters (what Mistral's templates want)."""
    return lambda index: "".join(secrets.choice(_ALPHANUMERIC) for _ in range(length))
