"""The reader shared by the families whose calls are XML-like tags (qwen3-xml, minimax-m2,
seed-oss): a block marker around one or more functions, each with its parameters as tags whose
text is the value, and a reasoning block before them.

    <tool_call>                      block_open
    <function=get_weather>           function_open NAME >
    <parameter=city>                 parameter_open KEY >
    Paris                            the value: plain text, typed by the tool's schema
    </parameter>                     parameter_close
    </function>                      function_close
    </tool_call>                     block_close

A family gives its `XmlCallSyntax`; `parse_xml_calls` is its parse (see family.py for the
contract: while the output grows, only what more text cannot change).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..family import (CONTENT, CUT_OFF, REASONING, Call, FamilyParse, Open, ParseContext, PartialCall, Segment, Text,
                      Thought, arguments_json, held_back, may_begin, property_schema, read_turn, reread_pace, skip_space,
                      string_value_partial, then, typed_value)


@dataclass(frozen=True)
class XmlCallSyntax:
    block_open: str  # "<tool_call>"
    block_close: str  # "</tool_call>"
    function_open: str  # "<function=": the tag's start; the name follows, up to ">"
    function_close: str  # "</function>"
    parameter_open: str  # "<parameter=": the key follows, up to ">"
    parameter_close: str = "</parameter>"
    reasoning: tuple[str, str] | None = None  # the reasoning block's open and close markers
    # Markers inside the reasoning that are not part of it (Seed-OSS's budget reflections):
    # dropped, their text kept.
    reasoning_tags: tuple[str, ...] = ()
    end_tokens: tuple[str, ...] = ()  # role and end-of-turn tokens: the output ends there
    # One newline on each side of a value is markup (the template writes "<parameter=k>\nv\n</parameter>").
    newline_around_values: bool = True
    # A function tag at the start of a line opens a call without block_open (Qwen3-Coder skips it).
    bare_function: bool = False

    @property
    def reasoning_ends(self) -> tuple[str, ...]:
        # A call ends an unclosed reasoning block (Qwen3.5 calls without closing </think>).
        return (self.reasoning[1], self.block_open) if self.reasoning else ()

    @property
    def markers(self) -> tuple[str, ...]:
        reasoning = self.reasoning or ()
        return (self.block_open, self.block_close, self.function_open, self.function_close, self.parameter_open,
                self.parameter_close, *reasoning, *self.reasoning_tags, *self.end_tokens)


# The state of a body that starts at a line's start (where a bare function tag opens a call).
BODY = "body"


def parse_xml_calls(syntax: XmlCallSyntax, text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, syntax.end_tokens, lambda turn, within: _parse_turn(syntax, turn, within))


def _parse_turn(syntax: XmlCallSyntax, text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = _split_reasoning(syntax, text, context)
    if body is None:
        return reasoning
    return then(reasoning, body, _read_body(syntax, text[body:], context, line_start=context.state != CONTENT))


# --- reasoning -------------------------------------------------------------------------------------

def _split_reasoning(syntax: XmlCallSyntax, text: str, context: ParseContext) -> tuple[FamilyParse, int | None]:
    """(the reasoning, where the text after it starts: None while the reasoning's end is unknown)."""
    if syntax.reasoning is None or context.state not in (None, REASONING):
        return FamilyParse(()), 0
    if context.state == REASONING:
        start = 0
    else:
        opener, _ = syntax.reasoning
        begins = skip_space(text, 0)
        if text.startswith(opener, begins):
            start = begins + len(opener)
        elif not context.final and opener.startswith(text[begins:]):
            return FamilyParse(()), None  # may still open (or is the reasoning's first characters): wait
        elif context.reasoning_open:
            start = 0
        else:
            return FamilyParse(()), 0
    end, after = _reasoning_end(syntax, text, start, context.final)
    if after is not None:
        return FamilyParse((Thought(_without_tags(text[start:end], syntax.reasoning_tags)),)), after
    if context.final:
        return FamilyParse((Thought(_without_tags(text[start:end], syntax.reasoning_tags)),)), len(text)
    held = (*syntax.reasoning_ends, *syntax.reasoning_tags)
    # What waits is what may begin a marker at the end of the text (not before a call opener, which
    # is known to follow it).
    at = min(end, len(text) - held_back(text[start:], held))
    thought = Thought(_without_tags(text[start:at], syntax.reasoning_tags))
    # Up to a call opener that may begin a call, the reasoning waits for what follows it.
    opened = Open(at, REASONING, Thought, held) if end == len(text) else Open(at, REASONING)
    return FamilyParse((thought,), open=opened), None


def _reasoning_end(syntax: XmlCallSyntax, text: str, start: int, final: bool) -> tuple[int, int | None]:
    """Where the reasoning ends and where the text after it starts (None: not yet known; the
    reasoning is then known up to the end). Its close marker ends it; so does a call opener
    followed by a function tag (the call stays in the text after), but not one the reasoning
    only mentions ("I should use <tool_call> here")."""
    closer, opener = syntax.reasoning_ends
    close = text.find(closer, start)
    limit = len(text) if close < 0 else close
    found = text.find(opener, start, limit)
    while found >= 0:
        tag = skip_space(text, found + len(opener))
        if text.startswith(syntax.function_open, tag):
            return found, found
        if not final and may_begin(text, tag, (syntax.function_open,)):
            return found, None  # may be a call: the reasoning is known up to its opener
        found = text.find(opener, found + 1, limit)
    return (close, close + len(closer)) if close >= 0 else (len(text), None)


def _without_tags(text: str, tags: Sequence[str]) -> str:
    for tag in tags:
        text = text.replace(tag, "")
    return text


# --- content and calls -----------------------------------------------------------------------------

@dataclass
class _Block:
    """What a call block (from its opener) gave: the functions read, where the block ends
    (None: not complete), where the unread text starts, and why it cannot be read (None:
    complete, or waiting for more text)."""

    calls: list[Call] = field(default_factory=list)
    end: int | None = None
    unread: int = 0
    problem: str | None = None
    partial: PartialCall | None = None  # the function being written, as far as it settled


def _read_body(syntax: XmlCallSyntax, body: str, context: ParseContext, line_start: bool) -> FamilyParse:
    """Content and calls after the reasoning. `line_start`: the body's first character starts
    a line (where a bare function tag opens a call)."""
    segments: list[Segment] = []
    error = None
    text_from = search_from = 0
    waits = _Waits(syntax, body, line_start)
    while (start := _next_block(syntax, body, search_from, line_start)) is not None:
        bare = not body.startswith(syntax.block_open, start)
        block = _read_block(syntax, body, start, bare, context)
        if bare and block.end is None:
            if block.problem is not None:  # a function tag that opens no call: text
                search_from = start + 1
                continue
            if not context.final:
                at, opened = waits.block(start)
                return FamilyParse(tuple(_with_text(segments, body[text_from:at])), error, opened)
            return FamilyParse(tuple(_with_text(segments, body[text_from:start])), CUT_OFF)
        at, opened = waits.block(start, repeats=len(block.calls))
        segments = _with_text(segments, body[text_from:start if block.end is not None or context.final else at])
        segments += block.calls
        if block.end is not None:
            text_from = search_from = block.end
            continue
        if block.problem is None:  # the output ended (or may still end) inside the block
            if not context.final:
                if block.partial is not None:  # its arguments stream
                    segments.append(block.partial)
                # Read again at a pace (a string value's text streams), not at every piece.
                return FamilyParse(tuple(segments), error, replace(opened, reread_after=reread_pace(block.partial)))
            # A call cut off by the end of the output was a call: dropped, markup and all (after
            # whole calls, what is left of the block: a call cut off, or its closer cut short).
            return FamilyParse(tuple(segments), CUT_OFF)
        close = body.find(syntax.block_close, block.unread)
        if close < 0:
            if not context.final:  # where the unreadable block ends is not known yet
                return FamilyParse(tuple(segments), error, replace(opened, stops=(syntax.block_close,)))
            return FamilyParse(tuple(_with_text(segments, body[block.unread:])), block.problem)
        end = close + len(syntax.block_close)
        segments = _with_text(segments, body[block.unread:end])
        error, text_from, search_from = block.problem, end, end
    if context.final:
        return FamilyParse(tuple(_with_text(segments, body[text_from:])), error)
    at, opened = waits.content(text_from)
    return FamilyParse(tuple(_with_text(segments, body[text_from:at])), error, opened)


class _Waits:
    """Where a body that has not ended is read on from (family.Open): plain content, or a block
    that has not ended."""

    def __init__(self, syntax: XmlCallSyntax, body: str, line_start: bool) -> None:
        self.syntax = syntax
        self.body = body
        self.line_start = line_start
        bare_start = ("\n" + syntax.function_open,) if syntax.bare_function else ()
        self.content_stops = (syntax.block_open, *bare_start)

    def content(self, start: int) -> tuple[int, Open]:
        """The end of the settled content from `start`, and the Open after it."""
        text = self.body[start:]
        if self.syntax.bare_function and self.line_start and start == 0 and "\n" not in text:
            # The body's first line: a function tag at its start opens a call (no newline before it).
            at = len(text) - held_back("\n" + text, self.content_stops)
            return max(at, 0), Open(0, BODY, Text) if at <= 0 else Open(at, CONTENT, Text, self.content_stops)
        at = start + len(text) - held_back(text, self.content_stops)
        return at, Open(at, CONTENT, Text, self.content_stops)

    def block(self, start: int, repeats: int = 0) -> tuple[int, Open]:
        """A block from `start` that has not ended (its `repeats` calls read so far): where the
        content before it ends, and the Open that reads it again from its start when what ends
        a function or the block comes. A bare function tag is read from the newline before it
        (or, at the body's start, as the body's start)."""
        stops = (self.syntax.function_close, self.syntax.block_close)
        if self.body.startswith(self.syntax.block_open, start):
            return start, Open(start, CONTENT, None, stops, repeats)
        if start > 0:
            return start - 1, Open(start - 1, CONTENT, None, stops, repeats)
        return 0, Open(0, BODY if self.line_start else CONTENT, None, stops, repeats)


def _with_text(segments: list[Segment], text: str) -> list[Segment]:
    return segments + [Text(text)] if text else segments


def _next_block(syntax: XmlCallSyntax, body: str, start: int, line_start: bool) -> int | None:
    found = [index for index in [body.find(syntax.block_open, start)] if index >= 0]
    if syntax.bare_function:
        bare = body.find(syntax.function_open, start)
        while bare >= 0 and (body[bare - 1] != "\n" if bare > 0 else not line_start):  # a bare function tag starts a line
            bare = body.find(syntax.function_open, bare + 1)
        found += [bare] if bare >= 0 else []
    return min(found) if found else None


def _read_block(syntax: XmlCallSyntax, text: str, start: int, bare: bool, context: ParseContext) -> _Block:
    block = _Block(unread=start)
    position = start if bare else start + len(syntax.block_open)
    while True:
        position = skip_space(text, position)
        if text.startswith(syntax.function_open, position):
            call, position, block.problem = _read_function(syntax, text, position, context)
            if not isinstance(call, Call):
                block.partial = call
                return block
            block.calls.append(call)
            block.unread = position
        elif text.startswith(syntax.block_close, position) and block.calls:
            block.end = position + len(syntax.block_close)
            return block
        else:
            if not may_begin(text, position, (syntax.function_open, syntax.block_close)):
                block.problem = f"the model's tool call could not be read: {syntax.function_open}NAME> was expected"
            return block


def _read_function(syntax: XmlCallSyntax, text: str, position: int,
                   context: ParseContext) -> tuple[Call | PartialCall | None, int, str | None]:
    """A function from its tag: (the call, where it ends, None), or (None, _, why it cannot be
    read; None while the text so far may still become one). While a string value is being
    written, the call as far as it settled (a PartialCall) instead of None."""
    name, position, problem = _tag_name(text, position + len(syntax.function_open))
    if name is None:
        return None, position, problem
    schema = context.schema_of(name)
    arguments: dict[str, Any] = {}
    while True:
        position = skip_space(text, position)
        if text.startswith(syntax.parameter_open, position):
            key, position, problem = _tag_name(text, position + len(syntax.parameter_open))
            if key is None:
                return None, position, problem
            end, after = _value_end(syntax, text, position)
            if end is None:  # the value goes on
                return _partial(syntax, name, arguments, key, text[position:], property_schema(schema, key)), position, None
            raw = _value_text(text[position:end], syntax.newline_around_values, closed=after > end)
            arguments[key] = parameter_value(raw, property_schema(schema, key))
            position = after
        elif text.startswith(syntax.function_close, position):
            return Call(name, arguments_json(arguments)), position + len(syntax.function_close), None
        elif text.startswith(syntax.block_close, position):
            return Call(name, arguments_json(arguments)), position, None  # the model left out the function close
        elif may_begin(text, position, (syntax.parameter_open, syntax.function_close, syntax.block_close)):
            return None, position, None
        else:
            return None, position, (f"the model's tool call could not be read: {syntax.parameter_open}KEY> "
                                    f"or {syntax.function_close} was expected")


def _partial(syntax: XmlCallSyntax, name: str, arguments: dict[str, Any], key: str, raw: str,
             schema: Mapping[str, Any]) -> PartialCall | None:
    """The call as far as it settled while a value is being written: the JSON of the values
    before it, and of the value's text so far where the value is a string (text stays text,
    and json.dumps escapes it a character at a time, so this is a prefix of the call's
    arguments); None for a value of another type (its JSON is known once it ends)."""
    if schema_types(schema) != {"string"}:
        return None
    if syntax.newline_around_values:
        if not raw:
            return None  # whether a newline (markup) comes first is not known yet
        raw = raw.removeprefix("\n")
    close = raw.rfind(syntax.parameter_close)
    after = raw[close + len(syntax.parameter_close):].lstrip() if close >= 0 else None
    if after is not None and any(tag.startswith(after) for tag in (syntax.parameter_open, syntax.function_close,
                                                                   syntax.block_close)):
        raw = raw[:close]  # a close tag, its next tag not (all) come yet: the value may end there
    ends = (syntax.parameter_close, "\n" + syntax.parameter_open, "\n" + syntax.function_close)
    raw = raw[:len(raw) - held_back(raw, ends)]
    raw = raw.removesuffix("\n")  # the newline before a close tag is markup (or ends a forgotten one's value)
    return string_value_partial(name, arguments, key, raw)


def _value_end(syntax: XmlCallSyntax, text: str, start: int) -> tuple[int | None, int]:
    """Where the value from `start` ends, and where the text after its close tag starts (the
    same place where the close tag was forgotten); (None, _) while it goes on.

    Its close tag counts only when the next tag follows it (values may hold the markers as
    text: "Close tags inline: </parameter> and </function>"); a parameter tag, or a function
    close and the block's close, at the start of a line also end a value whose close tag the
    model forgot. (str.find rather than one regular expression: the output is parsed again
    after every piece, and this is the part that scans long values.)"""
    next_tags = (syntax.parameter_open, syntax.function_close, syntax.block_close)
    closed = _find_followed(text, syntax.parameter_close, start, lambda after: text.startswith(next_tags, after))
    ends = [] if closed < 0 else [(closed, closed + len(syntax.parameter_close))]
    for tag, followed in ((syntax.parameter_open, lambda after: True),
                          (syntax.function_close, lambda after: text.startswith(syntax.block_close, after))):
        line_start = _find_followed(text, "\n" + tag, start, followed)
        ends += [] if line_start < 0 else [(line_start + 1, line_start + 1)]
    return min(ends) if ends else (None, start)


def _find_followed(text: str, marker: str, start: int, followed) -> int:
    """The first `marker` from `start` after which (and whitespace) `followed` holds; -1: none."""
    found = text.find(marker, start)
    while found >= 0 and not followed(skip_space(text, found + len(marker))):
        found = text.find(marker, found + 1)
    return found


def _tag_name(text: str, position: int) -> tuple[str | None, int, str | None]:
    """The name that ends a tag (`get_weather>`, `"get_weather">`): (name, after the tag, None),
    or (None, position, why not: None while the tag may still be completed)."""
    end = text.find(">", position)
    written = text[position:] if end < 0 else text[position:end]
    if "\n" in written or "<" in written:
        return None, position, "the model's tool call could not be read: a tag's name was not closed by '>'"
    if end < 0:
        return None, position, None
    name = written.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        name = name[1:-1]
    if not name:
        return None, position, "the model's tool call could not be read: a tag has no name"
    return name, end + 1, None


def _value_text(raw: str, newline_around: bool, closed: bool) -> str:
    """The value as the model meant it. Where the template writes a newline on each side,
    exactly one on each side is markup ("#include\\n\\n</parameter>" is "#include\\n"); a
    value whose close tag was forgotten ends with the newline before the next tag."""
    if newline_around and raw.startswith("\n"):
        raw = raw[1:]
    if (newline_around or not closed) and raw.endswith("\n"):
        raw = raw[:-1]
    return raw


# --- values ----------------------------------------------------------------------------------------

_PYTHON_LITERALS = {"True": ("boolean", True), "False": ("boolean", False), "None": ("null", None)}


def schema_types(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a property's schema allows: its type (or list of types), those of its
    anyOf/oneOf branches (Pydantic's nullable fields), else those of its enum or const values."""
    declared = schema.get("type")
    types = set(declared) if isinstance(declared, list) else {declared} if isinstance(declared, str) else set()
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            if isinstance(branch, Mapping):
                types |= schema_types(branch)
    if not types:
        values = list(schema.get("enum") or ()) + ([schema["const"]] if "const" in schema else [])
        types = {_json_type(value) for value in values}
    return types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "string")


def parameter_value(raw: str, schema: Mapping[str, Any]) -> Any:
    """A parameter's text as the JSON value its schema asks for. Strings stay text; other types
    are read as JSON, and where that fails as the Python literals some templates write
    (`True`, `None`, `{'a': 1}`: they render arguments with Python's str)."""
    types = schema_types(schema)
    value = typed_value(raw, {"type": sorted(types)} if types else {})
    if value is not raw or not types or types <= {"string"}:
        return value
    literal = _PYTHON_LITERALS.get(raw.strip())
    if literal is not None and literal[0] in types:
        return literal[1]
    if types & {"object", "array"}:
        try:
            parsed = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return raw
        if isinstance(parsed, (dict, list)) and _json_safe(parsed):
            return parsed
    return raw


def _json_safe(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(key, str) and _json_safe(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_json_safe(item) for item in value)
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return value is None or isinstance(value, (str, int, bool))
