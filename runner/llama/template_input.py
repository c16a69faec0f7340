"""What a chat template is rendered with, shaped as llama-server shapes it (common/chat.cpp), so
that the same conversation gives the same prompt on both.

A message becomes {role, content, reasoning_content, name, tool_call_id, tool_calls} (only the
fields it has, in that order; content "" where it has none), a call {type, function: {name,
arguments}, id} with its arguments as JSON text. Then, by what the template does (its
TemplateCaps): content as text or as parts, a system message merged into the next message where
the template ignores system messages, a call's arguments as an object where it reads one. The
variables besides the messages: bos_token, eos_token, enable_thinking, tools (only when there
are some, each {type, function: {name, description, parameters}}), the date (datetime,
date_string), the request's chat_template_kwargs, add_generation_prompt; preserve_reasoning and
reasoning_effort set the several names templates read them under.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .media import MEDIA_MARKER, MEDIA_PART_TYPES
from .template_caps import TemplateCaps

def template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message as llama.cpp writes it for a template (common_chat_msg::to_json_oaicompat)."""
    shaped: dict[str, Any] = {"role": message["role"]}
    content = message.get("content")
    if isinstance(content, (list, tuple)) and any(part.get("type") in MEDIA_PART_TYPES for part in content):
        shaped["content"] = joined_parts(content)  # media: the text with their markers in place
    elif isinstance(content, (list, tuple)):
        shaped["content"] = [{"type": part.get("type", "text"), "text": part.get("text", "")} for part in content]
    else:
        shaped["content"] = content or ""
    for name in ("reasoning_content", "name", "tool_call_id"):
        if isinstance(message.get(name), str) and message[name]:
            shaped[name] = message[name]
    calls = message.get("tool_calls")
    if calls:
        shaped["tool_calls"] = [_template_call(call) for call in calls]
    return shaped


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False, separators=(",", ":"))
    shaped: dict[str, Any] = {"type": "function", "function": {"name": function.get("name", ""), "arguments": arguments}}
    if isinstance(call.get("id"), str) and call["id"]:
        shaped["id"] = call["id"]
    return shaped


def joined_parts(parts: Sequence[Mapping[str, Any]]) -> str:
    """Content parts as one text, as llama.cpp joins them (concat_content_parts): a newline
    between two text parts, none around a medium, which stands as MEDIA_MARKER."""
    text, after_media = "", False
    for part in parts:
        if part.get("type") in MEDIA_PART_TYPES:
            text += MEDIA_MARKER
            after_media = True
        elif part.get("type", "text") == "text":
            text += ("\n" if text and not after_media else "") + str(part.get("text", ""))
            after_media = False
    return text


def content_text(content: Any) -> str:
    """A message's content as text: its parts joined (joined_parts), no content as ""."""
    return joined_parts(content) if isinstance(content, (list, tuple)) else content or ""


def _content_for(content: Any, caps: TemplateCaps) -> Any:
    """Content as text or as parts, by which of the two the template reads."""
    only_text = caps.supports_string_content and not caps.supports_typed_content
    only_parts = caps.supports_typed_content and not caps.supports_string_content
    if only_parts and isinstance(content, str):
        return [{"type": "text", "text": content}]
    if only_text and isinstance(content, list):
        return joined_parts(content)
    return content


def template_messages(messages: Sequence[Mapping[str, Any]], caps: TemplateCaps,
                      keeps_developer_role: bool = False) -> list[dict[str, Any]]:
    """The messages as llama-server renders them with this template; ValueError where it
    cannot (a call's arguments that are not JSON, for a template that reads them as an object)."""
    shaped = [template_message(message) for message in messages]
    for message in shaped:
        message["content"] = _content_for(message["content"], caps)
        if message["role"] == "developer" and not keeps_developer_role:
            message["role"] = "system"
    if not caps.supports_system_role and shaped and shaped[0]["role"] == "system":
        shaped = _system_merged(shaped)
    if caps.supports_object_arguments:
        for message in shaped:
            for call in message.get("tool_calls") or ():
                call["function"]["arguments"] = _arguments_object(call["function"]["arguments"])
    return shaped


def _system_merged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A template that ignores system messages: the system text goes before the next message's
    (a newline between), or is left out when nothing follows it."""
    system, rest = messages[0], messages[1:]
    if rest:
        if not isinstance(system["content"], str) or not isinstance(rest[0]["content"], str):
            raise ValueError("the chat template takes no system message, and one given as content parts cannot be "
                             "merged into the next message")
        rest[0] = rest[0] | {"content": f"{system['content']}\n{rest[0]['content']}"}
    return rest


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError as error:
        raise ValueError(f"a tool call's arguments are not JSON ({error})") from None


def template_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """OpenAI function tools as llama-server hands them to a template (None: no tools)."""
    if not tools:
        return None
    shaped = []
    for tool in tools:
        function = tool.get("function", tool)
        parameters = function.get("parameters")
        shaped.append({"type": "function", "function": {
            "name": function["name"], "description": function.get("description") or "",
            "parameters": parameters if parameters is not None else {}}})
    return shaped


# The names each switch is read under (llama.cpp: caps_apply_preserve_reasoning and
# caps_apply_reasoning_effort).
def preserve_reasoning_names(enabled: bool) -> dict[str, Any]:
    return {"preserve_thinking": enabled, "clear_thinking": not enabled, "truncate_history_thinking": not enabled,
            "drop_thinking": not enabled}


def reasoning_effort_names(effort: str) -> dict[str, Any]:
    return {"reasoning_effort": effort, "reasoning_strength": effort}


def template_variables(options: Mapping[str, Any] | None, enable_thinking: bool,
                       now: datetime.datetime) -> dict[str, Any]:
    """The variables besides messages and tools: enable_thinking, the date, the request's
    template options (chat_template_kwargs, which win), and what its switches stand for."""
    # preserve_reasoning is on unless a request turns it off (llama-server's default): a template
    # that can keep past turns' reasoning keeps it, so a turn's prompt begins with what the
    # model wrote before.
    variables: dict[str, Any] = {"enable_thinking": enable_thinking, "datetime": now.strftime("%b %d %Y"),
                                 "date_string": now.strftime("%d %b %Y"), "preserve_reasoning": True}
    variables.update(options or {})
    if isinstance(variables.get("preserve_reasoning"), bool):
        variables.update(preserve_reasoning_names(variables["preserve_reasoning"]))
    effort = variables.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        variables.update(reasoning_effort_names(effort))
    return variables
