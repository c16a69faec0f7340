"""Liquid LFM2 and LFM2.5: Python-style calls in a list between <|tool_call_start|> and
<|tool_call_end|>, reasoning (LFM2.5 thinking models) in <think>...</think>:

    <think>The user wants the time.</think>Let me check.<|tool_call_start|>[get_time(city="Paris"), Calendar.list_events(day=1)]<|tool_call_end|>

The arguments are keyword arguments with Python literals (True/None, and JSON's true/null as
llama.cpp allows); names may be dotted. Models told to use JSON tools write
[{"name": ..., "arguments": {...}}] in the same markers, which reads too.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
from typing import Any

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext, arguments_json, leading_reasoning, then
from ._marked_calls import closed_section, content_and_calls, named_calls

CALL, END_CALL = "<|tool_call_start|>", "<|tool_call_end|>"
THINK, END_THINK = "<think>", "</think>"
END_OF_TURN = "<|im_end|>"
_JSON_LITERALS = {"true": True, "false": False, "null": None}
# A name Python reads as a keyword argument's (ASCII: Python reads others in their NFKC form).
_IDENTIFIER = r"(?!(?:" + "|".join(keyword.kwlist) + r")(?![A-Za-z0-9_]))[A-Za-z_][A-Za-z0-9_]*"


class _NotALiteral(ValueError):
    pass


def _calls(body: str, context: ParseContext) -> tuple[Call, ...] | None:
    json_calls = _json_calls(body)
    return json_calls if json_calls is not None else _python_calls(body)


def _json_calls(body: str) -> tuple[Call, ...] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return named_calls(value, "name", ("arguments",))


def _python_calls(body: str) -> tuple[Call, ...] | None:
    """[name(key=value, ...), ...] read with Python's own parser (no code is run)."""
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    calls = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    try:
        read = tuple(_call_of(call) for call in calls)
    except (_NotALiteral, RecursionError):
        return None
    return read or None


def _call_of(node: ast.AST) -> Call:
    if not isinstance(node, ast.Call) or node.args:
        raise _NotALiteral("not a call with keyword arguments")
    if any(keyword.arg is None for keyword in node.keywords):
        raise _NotALiteral("**arguments")
    arguments = {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
    return Call(_dotted_name(node.func), arguments_json(arguments))


def _dotted_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise _NotALiteral("not a function's name")


def _literal(node: ast.AST) -> Any:
    """A Python literal (or JSON's true/false/null) as the JSON value it means."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, bool, int, float))):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise _NotALiteral("not a JSON number")
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_LITERALS:
        return _JSON_LITERALS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _NotALiteral("a sign before something else than a number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(element) for element in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _NotALiteral("**mapping")
        return {_key(key): _literal(value) for key, value in zip(node.keys, node.values)}
    raise _NotALiteral(ast.dump(node))


def _key(node: ast.AST) -> str:
    key = _literal(node)
    if not isinstance(key, str):
        raise _NotALiteral("a key that is not a string")
    return key


_read_calls = closed_section(END_CALL, _calls)


def parse(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = leading_reasoning(text, context, THINK, (END_THINK,))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALL,), _read_calls, hidden=(END_OF_TURN,)))


def template_messages(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """A turn's reasoning as the template reads it, `thinking` (llama.cpp's LFM2 handler)."""
    return [message | {"thinking": message["reasoning_content"]} if isinstance(message.get("reasoning_content"), str)
            else message for message in messages]


FAMILY = Family(
    name="lfm2",
    description='<|tool_call_start|>[name(key="value", n=1)]<|tool_call_end|> (Liquid LFM2, LFM2.5), <think>',
    parse=parse,
    # LFM2 lists the tools between its own tokens; LFM2.5 writes them plainly.
    fingerprints=(("<|tool_list_start|>", "<|tool_list_end|>"), ("List of tools: [", "<|im_start|>")),
    markers=(CALL, END_CALL, THINK, END_THINK, END_OF_TURN),
    reasoning=(THINK, END_THINK),
    priority=60,
    # Constrained calls as keyword arguments whose values are JSON (a string double-quoted, its
    # escapes Python's too), `, ` between arguments and calls. A function's name or a key that is
    # not a Python identifier (`get-weather`, `from`) cannot be written so: such calls are written
    # in the JSON form the reader also takes, [{"name": ..., "arguments": {...}}].
    call_syntax=CallSyntax(block_open=CALL + "[", block_close="]" + END_CALL, call_open="{name}(", call_close=")",
                           separator=", ", parameter_open="{key}=", parameter_separator=", ", values_as_json=True,
                           name_pattern=_IDENTIFIER + r"(?:\." + _IDENTIFIER + ")*", key_pattern=_IDENTIFIER,
                           fallback=CallSyntax(block_open=CALL + "[", block_close="]" + END_CALL, separator=", ",
                                               call_open='{"name": "{name}", "arguments": ', call_close="}")),
    template_messages=template_messages,
)
