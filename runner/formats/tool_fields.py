"""The tool-calling fields of an OpenAI body (or a JSONL line) as the engine's Request takes them.

`tools` ([{"type": "function", "function": {"name", "description", "parameters", "strict"}}]),
`tool_choice` ("auto" | "none" | "required" | {"type": "function", "function": {"name"}}),
`parallel_tool_calls`, and the legacy `functions` / `function_call` mapped onto them. A field
that cannot run is an ItemError naming it (`tools[3].function.parameters`, say).
"""

from __future__ import annotations

import json
from typing import Any

from ..tools import ChoiceMode, Tool, ToolChoice
from .fields import ItemError

TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
                         "reasoning_effort", "chat_template_kwargs"})
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# Names the chat template is rendered with already: options may not replace them.
RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
MAX_TOOLS = 1024  # more than any agent sends (Claude Code: ~100); bounds the grammar's size
MAX_TOOL_NAME = 256


def tool_overrides(body: dict[str, Any]) -> dict[str, Any]:
    """Request keywords for the body's tool fields: tools, tool_choice, parallel_tool_calls."""
    if body.get("tools") is not None and body.get("functions") is not None:
        raise ItemError("give 'tools' or the legacy 'functions', not both", "functions")
    tools = _tools(body["tools"], "tools") if body.get("tools") is not None else None
    if body.get("functions") is not None:
        tools = _tools([{"type": "function", "function": spec} for spec in _list(body["functions"], "functions")],
                       "functions", legacy=True)
    choice_field = "function_call" if body.get("function_call") is not None else "tool_choice"
    choice = _tool_choice(body.get(choice_field), choice_field, tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ItemError(f"'parallel_tool_calls' must be true or false, got {json.dumps(parallel)}",
                        "parallel_tool_calls")
    overrides: dict[str, Any] = {}
    if tools:
        overrides["tools"] = tuple(tools)
    if choice is not None and tools:
        overrides["tool_choice"] = choice
    if parallel is not None:
        overrides["parallel_tool_calls"] = parallel
    options = template_options(body)
    if options:
        overrides["template_options"] = options
    return overrides


def template_options(body: dict[str, Any]) -> dict[str, Any]:
    """What the chat template is rendered with besides the messages and tools: from
    `reasoning_effort` (OpenAI's), the switches templates read (Qwen3's and DeepSeek's
    enable_thinking and thinking, gpt-oss's reasoning_effort); then `chat_template_kwargs`
    (llama-server's and vLLM's), which wins."""
    options: dict[str, Any] = {}
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise ItemError(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, got {json.dumps(effort)}",
                            "reasoning_effort")
        thinks = effort != "none"
        # gpt-oss knows low, medium and high: the nearest of them stands for the others.
        nearest = {"none": "low", "minimal": "low", "xhigh": "high"}.get(effort, effort)
        options = {"enable_thinking": thinks, "thinking": thinks, "reasoning_effort": nearest}
    extra = body.get("chat_template_kwargs")
    if extra is not None:
        if not isinstance(extra, dict) or not all(isinstance(key, str) for key in extra):
            raise ItemError("'chat_template_kwargs' must be an object of named values", "chat_template_kwargs")
        reserved = sorted(RESERVED_TEMPLATE_NAMES & set(extra))
        if reserved:
            raise ItemError(f"'chat_template_kwargs' may not set {reserved[0]!r}: the server renders it",
                            "chat_template_kwargs")
        options.update(extra)
    return options


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise ItemError(f"{field!r} must be a list", field)
    if len(value) > MAX_TOOLS:
        raise ItemError(f"{field!r} holds {len(value)} tools; at most {MAX_TOOLS} are allowed", field)
    return value


def _tools(value: Any, field: str, legacy: bool = False) -> list[Tool]:
    tools = []
    for index, spec in enumerate(_list(value, field)):
        where = f"{field}[{index}]"
        if not isinstance(spec, dict) or spec.get("type") != "function":
            kind = spec.get("type") if isinstance(spec, dict) else None
            raise ItemError(f"{where} must be a function tool ({{'type': 'function', 'function': {{...}}}}), got type "
                            f"{json.dumps(kind)}", f"{where}.type")
        tools.append(read_tool(spec.get("function"), where if legacy else f"{where}.function"))
    names = [tool.name for tool in tools]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise ItemError(f"{field!r} holds two functions named {duplicate!r}", field)
    return tools


def read_tool(function: Any, where: str) -> Tool:
    """A function tool's name, description, parameters and strict flag, checked; an ItemError
    names the field under `where` (the chat API's tools[i].function, the Responses API's tools[i])."""
    if not isinstance(function, dict):
        raise ItemError(f"{where} must be an object with 'name' and 'parameters'", where)
    name = function.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TOOL_NAME or not name.isprintable():
        raise ItemError(f"{where}.name must be a printable string of 1 to {MAX_TOOL_NAME} characters, got "
                        f"{json.dumps(name)}", f"{where}.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ItemError(f"{where}.description must be a string", f"{where}.description")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ItemError(f"{where}.parameters must be a JSON schema object", f"{where}.parameters")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ItemError(f"{where}.strict must be true or false", f"{where}.strict")
    return Tool(name, description, parameters, bool(strict))


def _tool_choice(value: Any, field: str, tools: list[Tool] | None) -> ToolChoice | None:
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        if value == "required" and not tools:
            raise ItemError(f"{field!r} is 'required' but the request has no tools", field)
        return ToolChoice(ChoiceMode(value))
    name = _chosen_name(value)
    if name is None:
        raise ItemError(f"{field!r} must be 'auto', 'none', 'required' or {{'type': 'function', 'function': "
                        f"{{'name': ...}}}}, got {json.dumps(value)}", field)
    if name not in {tool.name for tool in tools or ()}:
        raise ItemError(f"{field!r} names the function {name!r}, which is not among the tools", field)
    return ToolChoice(ChoiceMode.FUNCTION, name)


def _chosen_name(value: Any) -> str | None:
    """The function a choice names: {"type": "function", "function": {"name"}}, or the legacy
    function_call's {"name"} (and the Responses API's flat {"type": "function", "name"})."""
    if not isinstance(value, dict):
        return None
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else value.get("name")
    return name if isinstance(name, str) else None
