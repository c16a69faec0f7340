"""Llama 3.1-3.3 and Llama 4.

Llama 3 writes a call as a JSON object, bare at the start of its output or after
<|python_tag|> (which may follow text); several are separated by `;`:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

Llama 3.1's built-in tools (brave_search, wolfram_alpha, code_interpreter, python) are called
after the tag in a syntax of their own, keyword arguments whose values are JSON, read as a
call of that tool with those arguments (as llama.cpp reads them):

    <|python_tag|>brave_search.call(query="weather in Paris")

Llama 4 writes a Python list of calls with keyword arguments (its "pythonic" format), bare at the
start or between <|python_start|> and <|python_end|>:

    [get_weather(city='Paris', unit='c'), get_time()]
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ..family import CONTENT, Call, Family, FamilyParse, Open, ParseContext, Text, skip_space, then
from ._json_calls import (BODY, JSON_CLOSERS, RAW, THINK_CLOSE, THINK_OPEN, Body, Malformed, Pending, Progress,
                          call_object, content_until, in_body, json_call_syntax, lead, read_raw, scan_value)

PYTHON_TAG = "<|python_tag|>"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"  # Llama 4 (its calls may also be written bare)
CALL_MARKERS = (PYTHON_TAG, PYTHON_START)

# Llama 3.1's built-in tools after the tag: `NAME.call(KEY=VALUE, ...)`.
BUILTIN_CALL = re.compile(r"\s*(\w+)\s*\.\s*call\(")
BUILTIN_CALL_PREFIX = re.compile(r"\s*(?:\w+\s*(?:\.\s*(?:c(?:a(?:l(?:l)?)?)?)?)?)?")
BUILTIN_ARGUMENT = re.compile(r"\s*(\w+)\s*=\s*")
BUILTIN_SCALAR_END = re.compile(r"[\s,)]")  # where a number or a literal among the arguments ends
NOT_BUILTIN = "the model's call of a built-in tool is not NAME.call(KEY=VALUE, ...) with JSON values"

# Llama 4's pythonic calls: `[name(` begins them, and a text that may still grow into that waits.
PYTHONIC_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
PYTHONIC_START_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")
NOT_PYTHONIC = "the model's tool calls are not a Python list of calls with literal keyword arguments"


def parse(text: str, context: ParseContext) -> FamilyParse:
    blocks = ((THINK_OPEN, THINK_CLOSE),) if context.reasons else ()
    reasoning, body = lead(text, context, blocks, settles=CALL_MARKERS, bare_call=_bare_call)
    if body is None:
        return reasoning
    return then(reasoning, body, _body(text[body:], context))


def _bare_call(text: str, position: int, final: bool) -> bool | None:
    """Whether the text at `position` begins a bare call (None: not known yet)."""
    if position >= len(text):
        return False if final else None
    if text[position] == "{":
        return True
    return _begins_pythonic(text, position, final) if text[position] == "[" else False


def _begins_pythonic(text: str, position: int, final: bool) -> bool | None:
    if PYTHONIC_START.match(text, position):
        return True
    return None if not final and PYTHONIC_START_PREFIX.fullmatch(text, position) else False


def _body(text: str, context: ParseContext) -> FamilyParse:
    if context.state == RAW:
        return read_raw(text, context)
    body = Body(text, context)
    position = 0
    if not in_body(context):  # the body's start: a call may stand bare
        begins = skip_space(text, 0)
        bare = _bare_call(text, begins, context.final)
        if bare is None:
            return body.parse(Open(0, BODY))
        if bare:
            read = _json_calls if text[begins] == "{" else _pythonic_calls
            after = body.group(begins, begins, read, BODY, JSON_CLOSERS)
            if isinstance(after, FamilyParse):
                return after
            position = after
    while True:
        found, marker = content_until(text, position, CALL_MARKERS, context)
        body.add_text(text[position:found])
        if marker is None:
            return body.parse(Open(found, CONTENT, Text, CALL_MARKERS))
        read = _tagged_calls if marker == PYTHON_TAG else _python_start_calls
        after = body.group(found, found + len(marker), read, CONTENT, JSON_CLOSERS)
        if isinstance(after, FamilyParse):
            return after
        position = after


def _tagged_calls(text: str, position: int, final: bool, progress: Progress) -> int:
    """After <|python_tag|>: a built-in tool's call, or JSON call objects."""
    builtin = BUILTIN_CALL.match(text, position)
    if builtin is not None:
        return _builtin_call(text, builtin, final, progress)
    if BUILTIN_CALL_PREFIX.fullmatch(text, position) and text[position:].strip():
        raise Pending  # a tool's name, or the start of `.call(` (at the end of the output: cut off)
    return _json_calls(text, position, final, progress)


def _builtin_call(text: str, found: re.Match[str], final: bool, progress: Progress) -> int:
    """`NAME.call(KEY=VALUE, ...)` from its match up to `(`: the call and where it ends."""
    arguments: dict[str, Any] = {}
    position = found.end()
    while (argument := BUILTIN_ARGUMENT.match(text, position)) is not None and argument.end() < len(text):
        value, position = scan_value(text, argument.end(), final, BUILTIN_SCALAR_END)
        arguments[argument.group(1)] = value.value
        position = skip_space(text, position)
        if not text.startswith(",", position):
            break
        position += 1
    position = skip_space(text, position)
    if position == len(text):
        raise Pending
    if text[position] != ")":
        raise Malformed(NOT_BUILTIN)
    position += 1
    progress.add(Call(found.group(1), json.dumps(arguments, ensure_ascii=False)), position)
    return position


def _json_calls(text: str, position: int, final: bool, progress: Progress) -> int:
    """Call objects separated by `;` or whitespace; what follows the last one is content."""
    while True:
        call, position = call_object(text, position, final)
        progress.add(call, position)
        position = _past_space(text, position, final, progress)
        if position < len(text) and text[position] == ";":
            position = _past_space(text, position + 1, final, progress)
        if position == len(text) or text[position] != "{":
            return position


def _past_space(text: str, position: int, final: bool, progress: Progress) -> int:
    """Past the whitespace after a call; Pending where the text ends in it (another call may follow)."""
    position = skip_space(text, position)
    if position == len(text) and not final:
        progress.between_calls = True
        raise Pending
    return position


def _python_start_calls(text: str, position: int, final: bool, progress: Progress) -> int:
    """After Llama 4's <|python_start|>: its calls (pythonic, or JSON), then <|python_end|>."""
    position = skip_space(text, position)
    if position == len(text):
        raise Pending
    read = _pythonic_calls if text[position] == "[" else _json_calls
    position = skip_space(text, read(text, position, final, progress))
    if text.startswith(PYTHON_END, position):
        return position + len(PYTHON_END)
    if PYTHON_END.startswith(text[position:]):
        if not final:
            progress.between_calls = True
            raise Pending
        return len(text)
    return position


def _pythonic_calls(text: str, position: int, final: bool, progress: Progress) -> int:
    """Llama 4's `[name(key=value, ...), ...]`, the values Python literals: read whole, then every
    call in it (made only when the whole list reads)."""
    end = _python_list_end(text, position)
    for name, arguments in _pythonic_call_list(text[position:end]):
        progress.add(Call(name, arguments), end)
    return end


def _python_list_end(text: str, start: int) -> int:
    """Just after the Python list at `start` (tracking strings, escapes and nesting to find its end)."""
    depth = 0
    quote = None
    is_escaped = False
    for position in range(start, len(text)):
        char = text[position]
        if quote is not None:
            if is_escaped:
                is_escaped = False
            elif char == "\\":
                is_escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return position + 1
    raise Pending


def _pythonic_call_list(text: str) -> list[tuple[str, str]]:
    """`[name(key=value, ...), ...]` as (name, arguments JSON text) pairs; the values are Python
    literals (strings in either quote, True, None, dicts, lists)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise Malformed(NOT_PYTHONIC) from None
    if not isinstance(tree, ast.List):
        raise Malformed(NOT_PYTHONIC)
    calls = []
    for node in tree.elts:
        name = _dotted_name(node.func) if isinstance(node, ast.Call) else None
        if name is None or node.args or any(keyword.arg is None for keyword in node.keywords):
            raise Malformed(NOT_PYTHONIC)
        try:
            arguments = {keyword.arg: _json_value(ast.literal_eval(keyword.value)) for keyword in node.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise Malformed(NOT_PYTHONIC) from None
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted_name(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _json_value(value: Any) -> Any:
    """A Python literal as the JSON value it stands for (tuples are arrays); ValueError where
    JSON has none (sets, bytes, complex numbers, NaN, keys that are not strings)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_value(item) for key, item in value.items()}
    raise ValueError(f"{type(value).__name__} is not JSON")


FAMILY = Family(
    name="llama3",
    description='{"name": ..., "parameters": {...}} or <|python_tag|>{...} (Llama 3.1-3.3); [f(a=1), g()] (Llama 4)',
    parse=parse,
    # Llama 4's template names its tool turns <|header_start|>ipython<|header_end|>.
    fingerprints=(("<|python_tag|>",), ("ipython", "<|start_header_id|>"), ("ipython", "<|header_start|>")),
    markers=("<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|python_start|>", "<|python_end|>", "<|eom|>", "<|eot|>"),
    priority=85,
    legacy_format="llama3",
    call_syntax=json_call_syntax(key="parameters", separator="; ", leads=True),
    keeps_space_before_calls=False,
)
