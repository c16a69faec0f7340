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
import re
from typing import Any

from ..family import (Call, CallSyntax, Family, FamilyParse, ParseContext, PartialCall, arguments_json, leading_reasoning,
                      skip_space, string_value_partial, then)
from ._marked_calls import Keys, closed_section, content_and_calls, first_call_partial, named_calls

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


_HEAD = re.compile(r"\s*\[?\s*([A-Za-z_][\w.]*)\(")
_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def _partial(body: str) -> PartialCall | None:
    """The first call of a list still being written, as far as it settled, while one of its
    arguments is a plain string (no escape yet: its text is what it reads as): the arguments
    before it as JSON, then its text so far. A JSON list of calls streams as the other formats'."""
    head = _HEAD.match(body)
    if head is None:
        return first_call_partial(body, Keys(("name",), ("arguments",)))
    name, position, settled = head.group(1), head.end(), {}
    while (argument := _KEYWORD.match(body, position)) is not None:
        start = argument.end()
        quote = body[start:start + 1]
        if quote in ("'", '"') and not body.startswith(quote * 3, start):
            text, end = _string_so_far(body, start + 1, quote)
            if text is None:  # an escape read otherwise here: it stops growing until the call ends
                return None
            if end is None:  # the string goes on
                return string_value_partial(name, settled, argument.group(1), text)
            settled[argument.group(1)], position = text, end
        else:
            end = _value_end(body, start)
            try:
                settled[argument.group(1)] = _literal(ast.parse(body[start:end].strip(), mode="eval").body)
            except (SyntaxError, ValueError, _NotALiteral, RecursionError, MemoryError):
                return None
            position = end
        position = skip_space(body, position)
        if not body.startswith(",", position):
            return None
        position += 1
    return None


_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def _string_so_far(body: str, start: int, quote: str) -> tuple[str | None, int | None]:
    """A one-line string literal's text from `start` (after its quote) as Python reads it, and
    where it ends (after its closing quote; None: not yet). The common escapes (and \\uXXXX) are
    read; at another (octal, \\x, \\N{...}, a line continuation) or a line break, (None, None)."""
    parts, position = [], start
    while position < len(body):
        char = body[position]
        if char == quote:
            return "".join(parts), position + 1
        if char == "\n":
            return None, None
        if char != "\\":
            parts.append(char)
            position += 1
            continue
        code = body[position + 1:position + 2]
        if code in _SIMPLE_ESCAPES:
            parts.append(_SIMPLE_ESCAPES[code])
            position += 2
        elif code == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[position + 2:position + 6]):
            parts.append(chr(int(body[position + 2:position + 6], 16)))
            position += 6
        elif not code or (code == "u" and re.fullmatch(r"[0-9a-fA-F]{0,3}", body[position + 2:])):
            break  # the escape is not whole yet
        else:
            return None, None
    return "".join(parts), None


def _value_end(body: str, start: int) -> int:
    """Where a (non-string) value from `start` ends: the first `,` or `)` outside brackets and
    strings (the end of the text where there is none yet)."""
    depth, position, quote = 0, start, None
    while position < len(body):
        char = body[position]
        if quote:
            position += 2 if char == "\\" else 1
            quote = None if char == quote else quote
            continue
        if char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return position
            depth -= 1
        elif char == "," and depth == 0:
            return position
        position += 1
    return len(body)


_read_calls = closed_section(END_CALL, _calls, streams=_partial)


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
