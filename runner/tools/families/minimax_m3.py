"""MiniMax-M3: XML-like calls whose every tag starts with the namespace token ]<]minimax[>[, a
parameter's name being its tag; objects and arrays are nested elements (an array's are <item>):

    <mm:think>The user wants the weather.</mm:think>Let me look.]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[<days>3]<]minimax[>[</days>]<]minimax[>[<hours>]<]minimax[>[<item>9]<]minimax[>[</item>]<]minimax[>[</hours>]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

Reasoning is in <mm:think>...</mm:think>; a turn without it starts with a bare </mm:think>
(written by the generation prompt when thinking is disabled, or by the model). Values are the
text between the tags, typed by the tool's schema (the template writes numbers and booleans
as JSON, strings raw). A parameter whose value is nested elements is read as the object or
array they write, also where the schema allows a string (llama.cpp reads that one as the raw
markup: a model writes elements for a value it means as a structure, and the namespace token
is no text). [e~[ ends the turn, ]~b] starts another: the output ends at either.
(llama.cpp: common/parsers/minimax-m3.cpp.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..family import (CONTENT, CUT_OFF, Call, CallSyntax, Family, FamilyParse, Open, ParseContext, PartialCall, Segment,
                      Text, arguments_json, held_back, leading_reasoning, nonempty, property_schema, read_turn,
                      reread_pace, string_value_partial, then)
from ._marked_calls import UNREADABLE, skip_space, without
from ._xml_calls import parameter_value, schema_types

NS = "]<]minimax[>["
BLOCK_OPEN, BLOCK_CLOSE = NS + "<tool_call>", NS + "</tool_call>"
INVOKE_OPEN, INVOKE_CLOSE = NS + '<invoke name="', NS + "</invoke>"
THINK, END_THINK = "<mm:think>", "</mm:think>"
END_OF_TURN, START_OF_TURN, START_OF_DOCUMENT = "[e~[", "]~b]", "]~!b["
ITEM = "item"
# Dropped from content: a bare </mm:think> (a turn without reasoning) is no text.
HIDDEN = (END_THINK,)
# Content goes on, as written, until one of these: a call block, a marker dropped from it, the
# end of the turn (cut by read_turn), or the start of a document (held while it may come).
CONTENT_STOPS = (BLOCK_OPEN, END_THINK, END_OF_TURN, START_OF_TURN, START_OF_DOCUMENT)
# A block that has not ended is read again when one of its calls, or the block, may have closed.
BLOCK_STOPS = (INVOKE_CLOSE, BLOCK_CLOSE)

_TAG = re.compile(r"([^<>/\s]+)>")  # an element's opening tag, after the namespace token and "<"
_NAME = re.compile(r'([^"<>\n]+)">')


class _More(Exception):
    """The text ends before the call does (`partial`: the call as far as it settled, while a
    top-level string value is written)."""

    def __init__(self, partial: PartialCall | None = None) -> None:
        super().__init__()
        self.partial = partial


class _Broken(Exception):
    """The text is not a call in this format."""


@dataclass
class _Block:
    calls: list[Call] = field(default_factory=list)
    end: int | None = None  # after the block's close (None: not read to its end)
    unread: int = 0  # where the text not read as calls starts
    problem: str | None = None  # CUT_OFF, UNREADABLE, or None (read, or waiting for more text)
    partial: PartialCall | None = None  # the invoke being written, as far as it settled


def parse(text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, (END_OF_TURN, START_OF_TURN), _parse_turn)


def _parse_turn(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = leading_reasoning(text, context, THINK, (END_THINK,), also_ending=(BLOCK_OPEN,))
    if body is None:
        return reasoning
    return then(reasoning, body, _answer(text[body:], context))


def _answer(text: str, context: ParseContext) -> FamilyParse:
    """Content and call blocks (in the state CONTENT, or at the answer's start: they read alike)."""
    segments: list[Segment] = []
    error = None
    position = 0
    while (start := text.find(BLOCK_OPEN, position)) >= 0:
        segments.append(Text(without(text[position:start], HIDDEN)))
        block = _read_block(text, start + len(BLOCK_OPEN), context)
        segments += block.calls
        if block.end is None and block.problem is None:
            if context.final:  # whole calls, only the block's close left out at the end: read
                return FamilyParse(nonempty(segments), error)
            # Not ended yet: read again from its opener (its calls so far come again), and at a
            # pace: the invoke being written streams.
            return FamilyParse((*nonempty(segments), *([block.partial] if block.partial else [])), error,
                               Open(start, CONTENT, None, BLOCK_STOPS, len(block.calls), reread_pace(block.partial)))
        if block.problem is not None:
            # A call cut off by the end of the output is dropped (the whole calls before it
            # stand); a block that cannot be read is content, its raw text as the model wrote
            # it (from the end of its last whole call).
            if block.problem != CUT_OFF:
                segments.append(Text(text[block.unread if block.calls else start:block.end or len(text)]))
            error = block.problem
        if block.end is None:  # the output ended in the block
            return FamilyParse(nonempty(segments), error)
        position = block.end
    # Text that may begin a marker waits (a whole </mm:think> never does: no end of it begins one).
    at = len(text) if context.final else len(text) - held_back(text[position:], CONTENT_STOPS)
    segments.append(Text(without(text[position:at], HIDDEN)))
    return FamilyParse(nonempty(segments), error, Open(at, CONTENT, Text, CONTENT_STOPS))


def _read_block(text: str, position: int, context: ParseContext) -> _Block:
    """The invokes after the block's opening, up to its close."""
    block = _Block(unread=position)
    while True:
        position = skip_space(text, position)
        if text.startswith(BLOCK_CLOSE, position):
            block.end = position + len(BLOCK_CLOSE)
            return block
        try:
            call, position = _read_invoke(text, position, context)
        except _More as more:
            if context.final:
                # Calls complete and only the block's close missing: read.
                block.problem = CUT_OFF if text[block.unread:].strip() or not block.calls else None
            block.partial = more.partial
            return block
        except _Broken:
            close = text.find(BLOCK_CLOSE, position)
            if close < 0 and not context.final:
                return block  # where the unreadable block ends is not known yet
            block.problem, block.end = UNREADABLE, (close + len(BLOCK_CLOSE) if close >= 0 else None)
            return block
        block.calls.append(call)
        block.unread = position


def _expect(text: str, position: int, marker: str) -> int:
    """After `marker` at `position`; _More where the text ends inside it, _Broken where it is not there."""
    if text.startswith(marker, position):
        return position + len(marker)
    if marker.startswith(text[position:]):
        raise _More
    raise _Broken


def _read_invoke(text: str, position: int, context: ParseContext) -> tuple[Call, int]:
    position = _expect(text, position, INVOKE_OPEN)
    name = _NAME.match(text, position)
    if name is None:
        if re.fullmatch(r'[^"<>\n]*"?', text[position:]):
            raise _More
        raise _Broken
    schema = context.schema_of(name.group(1).strip())
    try:
        arguments, position = _read_members(text, name.end(), INVOKE_CLOSE, schema)
    except _More:
        raise _More(_partial(text, name.end(), name.group(1).strip(), schema)) from None
    return Call(name.group(1).strip(), arguments_json(arguments)), position


def _partial(text: str, position: int, name: str, schema: Mapping[str, Any]) -> PartialCall | None:
    """The invoke from `position` (its members) as far as it settled, while one of its top-level
    string values is written; None otherwise."""
    members: dict[str, Any] = {}
    while True:
        position = skip_space(text, position)
        tag = _TAG.match(text, position + len(NS) + 1) if text.startswith(NS + "<", position) else None
        if tag is None:
            return None
        close = f"{NS}</{tag.group(1)}>"
        if _only_string(property_schema(_branch(schema, "object"), tag.group(1))) and text.find(close, tag.end()) < 0:
            raw = text[tag.end():]
            return string_value_partial(name, members, tag.group(1), raw[:len(raw) - held_back(raw, (close,))])
        try:
            _, members[tag.group(1)], position = _read_element(text, position, property_schema(schema, ""), schema)
        except (_More, _Broken):
            return None


def _read_members(text: str, position: int, close: str, schema: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Elements up to `close`, as an object's members: (the object, after `close`)."""
    members: dict[str, Any] = {}
    while True:
        position = skip_space(text, position)
        if text.startswith(close, position):
            return members, position + len(close)
        if close.startswith(text[position:]):
            raise _More
        key, value, position = _read_element(text, position, property_schema(schema, ""), schema)
        members[key] = value


def _read_items(text: str, position: int, close: str, schema: Mapping[str, Any]) -> tuple[list[Any], int]:
    items: list[Any] = []
    while True:
        position = skip_space(text, position)
        if text.startswith(close, position):
            return items, position + len(close)
        if close.startswith(text[position:]):
            raise _More
        _, value, position = _read_element(text, position, _branch(schema, "array").get("items") or {}, None)
        items.append(value)


def _read_element(text: str, position: int, item_schema: Mapping[str, Any],
                  parent: Mapping[str, Any] | None) -> tuple[str, Any, int]:
    """One element: (its tag, its value, after its close). `parent`: the schema of the object
    it is a member of (its property's schema comes from it), None for an array's item."""
    position = _expect(text, position, NS + "<")
    tag = _TAG.match(text, position)
    if tag is None:
        if re.fullmatch(r"[^<>/\s]*", text[position:]):
            raise _More
        raise _Broken
    key = tag.group(1)
    schema = property_schema(_branch(parent, "object"), key) if parent is not None else item_schema
    close = f"{NS}</{key}>"
    start = tag.end()
    if skip_space(text, start) == len(text):
        raise _More
    nested = text.startswith(NS + "<", skip_space(text, start)) and not text.startswith(NS + "</", skip_space(text, start))
    if nested and not _only_string(schema):
        return key, *_read_nested(text, skip_space(text, start), close, schema)
    end = text.find(close, start)
    if end < 0:
        raise _More
    raw = text[start:end]
    if NS in raw and not _only_string(schema):
        raise _Broken  # markup that is not elements: not a value
    return key, _scalar(raw, schema), end + len(close)


def _read_nested(text: str, position: int, close: str, schema: Mapping[str, Any]) -> tuple[Any, int]:
    """Nested elements: an array where the schema wants one, an object where it wants one, and
    where it allows both (or says nothing) an array when they are <item>s."""
    types = schema_types(schema) & {"array", "object"}
    items = text.startswith(f"{NS}<{ITEM}>", position)
    if types == {"array"} or (types != {"object"} and items):
        return _read_items(text, position, close, schema)
    return _read_members(text, position, close, schema)


def _scalar(raw: str, schema: Mapping[str, Any]) -> Any:
    """A value written as text: an empty one is the empty container its schema wants."""
    types = schema_types(schema)
    if not raw.strip() and types and "string" not in types:
        if "array" in types:
            return []
        if "object" in types:
            return {}
    return parameter_value(raw, schema)


def _only_string(schema: Mapping[str, Any]) -> bool:
    types = schema_types(schema)
    return bool(types) and types <= {"string"}


def _branch(schema: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    """The part of a schema that describes values of `kind` (an anyOf/oneOf alternative's)."""
    if not schema:
        return {}
    for key in ("anyOf", "oneOf"):
        for alternative in schema.get(key) or ():
            if isinstance(alternative, Mapping) and kind in schema_types(alternative):
                return alternative
    return schema


FAMILY = Family(
    name="minimax-m3",
    description="]<]minimax[>[<tool_call> ]<]minimax[>[<invoke name=NAME>]<]minimax[>[<KEY>VALUE]<]minimax[>[</KEY>"
                "... (MiniMax-M3), reasoning in <mm:think>",
    parse=parse,
    fingerprints=((NS, "<invoke name="),),
    markers=(NS, THINK, END_THINK, END_OF_TURN, START_OF_TURN, START_OF_DOCUMENT),
    reasoning=(THINK, END_THINK),
    priority=30,  # before hermes (80), whose fingerprint ("<tool_call>") the template also holds
    # A constrained call as the template writes it; a value that is not a string is written as
    # its JSON (the reader takes both JSON and nested elements).
    call_syntax=CallSyntax(block_open=NS + "<tool_call>\n", call_open=NS + '<invoke name="{name}">',
                           call_close=NS + "</invoke>\n", block_close=NS + "</tool_call>",
                           parameter_open=NS + "<{key}>", parameter_close=NS + "</{key}>"),
)
