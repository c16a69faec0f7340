"""Pieces shared by the families whose calls sit in marked sections of the output (Granite,
Command R7B, Apertus, LFM2, Functionary): a reasoning block at the start, content, and
sections that a marker opens and (mostly) a marker closes, each read into calls.

Not a family (the registry skips modules whose name starts with "_"). Every function is a
plain function of the text, keeping the parse contract of multiseq.tools.family: while the
output grows, only what more text cannot change comes back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..family import (CONTENT, CUT_OFF, STRICT_JSON, Call, FamilyParse, Open, ParseContext, PartialCall, Segment, Text,
                      arguments_json, held_back, reread_pace, skip_space)
from ..partial_json import settled_prefix

UNREADABLE = "the model's tool call could not be read"


# --- sections --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calls:
    """A section read whole: its calls, and where the text after it starts."""

    calls: tuple[Call, ...]
    end: int


@dataclass(frozen=True)
class Unreadable:
    """A section that is not a call (cut off, or not in the format): its raw text, up to `end`,
    is given back as content, and `error` says why. `rest_is_text`: no call can follow it (its
    text runs on to the end of the output, all of it content)."""

    error: str
    end: int
    rest_is_text: bool = False


# The state after a section whose text runs on to the end of the output: all of it content.
RAW = "raw"


# A section reader: (text, start of its opening marker, that marker, context) -> Calls or
# Unreadable, or None while the output grows and the section has not ended. Its `stops`
# attribute, where it has one, names the strings without which a section that has not ended
# stays so (its closer): the reader then reads the section again only when one comes.
SectionReader = Callable[[str, int, str, ParseContext], "Calls | Unreadable | None"]


def section_reader(stops: tuple[str, ...]) -> Callable[[SectionReader], SectionReader]:
    """Gives a section reader the strings without which its section stays unended."""
    def mark(read: SectionReader) -> SectionReader:
        read.stops = stops
        return read
    return mark


def content_and_calls(text: str, context: ParseContext, openers: Sequence[str], read_section: SectionReader,
                      hidden: Sequence[str] = ()) -> FamilyParse:
    """Content with call sections in it: every section that one of `openers` starts is read by
    `read_section`. `hidden`: markers that wrap content (response markers, end-of-turn tokens)
    and are dropped from it. The text is read in the middle of content (the state CONTENT is
    where it resumes)."""
    if context.state == RAW:
        return FamilyParse((Text(text),) if text else (), open=Open(len(text), RAW, Text, ()))
    segments: list[Segment] = []
    error: str | None = None
    position = 0
    waiting_for = (*openers, *hidden)
    while True:
        start, opener = first_of(text, openers, position)
        if opener is None:
            # What waits is the start of a marker. Nothing left adds no segment, so that a
            # section cut off by the end stays the last one.
            at = len(text) if context.final else len(text) - held_back(text[position:], waiting_for)
            rest = without(text[position:at], hidden)
            if rest:
                segments.append(Text(rest))
            return FamilyParse(tuple(segments), error, Open(at, CONTENT, Text, waiting_for))
        segments.append(Text(without(text[position:start], hidden)))
        section = read_section(text, start, opener, context)
        if section is None or isinstance(section, PartialCall):  # not ended yet: everything from here waits
            stops = getattr(read_section, "stops", None)
            if section is None:  # (a section whose first call streams is read again at a pace)
                pace = reread_pace(None) if getattr(read_section, "streams_calls", False) else 0
                return FamilyParse(tuple(segments), error, Open(start, CONTENT, None, stops, reread_after=pace))
            # Its first call's arguments stream: read again at a pace too.
            return FamilyParse((*segments, section), error, Open(start, CONTENT, None, stops,
                                                                  reread_after=reread_pace(section)))
        if isinstance(section, Unreadable):
            if section.rest_is_text:
                segments.append(Text(text[start:]))
                return FamilyParse(tuple(segments), section.error, Open(len(text), RAW, Text, ()))
            if section.error != CUT_OFF:  # a call cut off by the end of the output was a call: dropped
                segments.append(Text(text[start:section.end]))  # the raw text, as the model wrote it
            error = section.error
        else:
            segments.extend(section.calls)
        position = section.end


# The keys of a JSON call's name and of its arguments, where a section's calls stream (Keys(("name",),
# ("arguments",))): the first call's arguments go out as they are written.
@dataclass(frozen=True)
class Keys:
    name: tuple[str, ...]
    arguments: tuple[str, ...]
    name_is_key: bool = False  # a call may be {NAME: {arguments}} too (Apertus)


def closed_section(closer: str, read_body: Callable[[str, ParseContext], tuple[Call, ...] | None],
                   streams: Keys | Callable[[str], PartialCall | None] | None = None) -> SectionReader:
    """A reader of sections that `closer` ends: the body between the markers read by `read_body`
    (None: not calls). A section never closed is cut off; while it is written, with `streams`,
    its first call as far as it settled (first_call_partial with these keys, or the family's own
    function of the body)."""
    @section_reader((closer,))
    def read(text: str, start: int, opener: str, context: ParseContext) -> Calls | Unreadable | PartialCall | None:
        body_start = start + len(opener)
        end = text.find(closer, body_start)
        if end < 0:
            if context.final:
                return Unreadable(CUT_OFF, len(text))
            return first_call_partial(text[body_start:len(text) - held_back(text, (closer,))], streams)
        calls = read_body(text[body_start:end], context)
        if calls is None:
            return Unreadable(UNREADABLE, end + len(closer))
        return Calls(calls, end + len(closer))
    read.streams_calls = streams is not None  # content_and_calls reads it again at a pace
    return read


# A JSON list or object ends at a closing bracket: until one comes, a section that a JSON value
# ends has not ended (where the value is not JSON, the text waits for the next bracket, or for
# the end, to be given back).
JSON_ENDS = ("}", "]")


def json_section(read_value: Callable[[Any, ParseContext], tuple[Call, ...] | None],
                 opener_keeps: int = 0, streams: Keys | Callable[[str], PartialCall | None] | None = None) -> SectionReader:
    """A reader of sections with no closing marker: the JSON value after the opener ends it.
    `opener_keeps`: how many of the opener's last characters begin the value (a "["); `streams`
    as closed_section's."""
    @section_reader(JSON_ENDS)
    def read(text: str, start: int, opener: str, context: ParseContext) -> Calls | Unreadable | PartialCall | None:
        found = json_value_at(text, start + len(opener) - opener_keeps)
        if isinstance(found, JsonCutOff):
            if context.final:
                return Unreadable(CUT_OFF, len(text))
            return first_call_partial(text[start + len(opener) - opener_keeps:], streams)
        if isinstance(found, JsonBroken):
            return Unreadable(UNREADABLE, len(text), rest_is_text=True)  # not JSON: what follows is not a call either
        value, end = found
        calls = read_value(value, context)
        if calls is None:
            return Unreadable(UNREADABLE, end)
        return Calls(calls, end)
    read.streams_calls = streams is not None  # content_and_calls reads it again at a pace
    return read


# --- JSON ------------------------------------------------------------------------------------

class JsonCutOff:
    """The text ends before the JSON value does."""


class JsonBroken:
    """The text after the marker is not JSON."""




def json_value_at(text: str, start: int) -> tuple[Any, int] | JsonCutOff | JsonBroken:
    """The JSON value that starts at `start` (after whitespace) and where it ends; JsonCutOff
    when the text ends inside it, JsonBroken when it is not JSON."""
    begin = skip_space(text, start)
    if begin == len(text):
        return JsonCutOff()
    try:
        value, end = STRICT_JSON.raw_decode(text, begin)
    except json.JSONDecodeError as failure:
        return JsonCutOff() if _ends_inside(text, begin, failure) else JsonBroken()
    except ValueError:  # NaN, Infinity
        return JsonBroken()
    return value, end


def _ends_inside(text: str, begin: int, failure: json.JSONDecodeError) -> bool:
    """Whether the decoder failed because the text ended inside the value (it is the start of
    some JSON value), not because of a character JSON does not allow."""
    return _json_prefix(text, begin)


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = ("true", "false", "null")


def _json_prefix(text: str, position: int) -> bool:
    """Whether text[position:] is the start of a JSON value that has not ended."""
    closing = []  # the brackets still open, innermost last
    expect = "value"  # value | value-or-close | key | key-or-close | colon | comma-or-close
    while True:
        position = skip_space(text, position)
        if position >= len(text):
            return True
        char = text[position]
        if expect.endswith("close") and char == (closing[-1] if closing else None):
            closing.pop()
            position, expect = position + 1, "comma-or-close"
        elif expect in ("value", "value-or-close"):
            if char in "{[":
                closing.append("}" if char == "{" else "]")
                position, expect = position + 1, "key-or-close" if char == "{" else "value-or-close"
                continue
            end = _scalar_end(text, position)
            if end is None:
                return False
            if end >= len(text):
                return True
            position, expect = end, "comma-or-close"
        elif expect in ("key", "key-or-close"):
            if char != '"':
                return False
            end = _string_end(text, position)
            if end is None:
                return True
            position, expect = end, "colon"
        elif expect == "colon":
            if char != ":":
                return False
            position, expect = position + 1, "value"
        else:  # comma-or-close, and not the closing bracket
            if char != "," or not closing:
                return False
            position, expect = position + 1, "key" if closing[-1] == "}" else "value"
        if not closing and expect == "comma-or-close":
            return False  # a whole value: not cut off (the decoder refused it for another reason)


def _scalar_end(text: str, position: int) -> int | None:
    """Where the string, number or literal at `position` ends (len(text) when the text ends in
    it); None when none starts there."""
    if text[position] == '"':
        end = _string_end(text, position)
        return len(text) if end is None else end
    number = _NUMBER.match(text, position)
    if number:
        return len(text) if number.end() == len(text) else number.end()
    if text[position:] == "-":
        return len(text)
    for literal in _LITERALS:
        if text.startswith(literal, position):
            return position + len(literal)
        if literal.startswith(text[position:]):
            return len(text)
    return None


def _string_end(text: str, quote: int) -> int | None:
    """Just after the string that opens at `quote`; None when the text ends inside it."""
    position = quote + 1
    while position < len(text):
        if text[position] == "\\":
            position += 2
        elif text[position] == '"':
            return position + 1
        else:
            position += 1
    return None


def arguments_of(value: Any) -> str | None:
    """A call's arguments as the JSON text of an object: an object, a string holding one, or
    nothing (no arguments); None when they are something else."""
    if value is None:
        return "{}"
    if isinstance(value, dict):
        return arguments_json(value)
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return None
        return arguments_json(decoded) if isinstance(decoded, dict) else None
    return None


def named_calls(value: Any, name_key: str, arguments_keys: Sequence[str]) -> tuple[Call, ...] | None:
    """[{name_key: ..., <one of arguments_keys>: {...}}, ...] (or one such object) as calls."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(name_key), str) or not item[name_key]:
            return None
        arguments = arguments_of(next((item[key] for key in arguments_keys if key in item), None))
        if arguments is None:
            return None
        calls.append(Call(item[name_key], arguments))
    return tuple(calls) if calls else None


def first_call_partial(body: str, keys: Keys | Callable[[str], PartialCall | None] | None) -> PartialCall | None:
    """The first call of a JSON list (or object) of calls still being written, as far as it
    settled: once its name is written and its arguments object began, its arguments as
    arguments_json will write them (partial_json); None before that, or without `keys`. (Only
    the first: a section's calls go out together once it ends.)"""
    if keys is None or callable(keys):
        return None if keys is None else keys(body)
    position = skip_space(body, 0)
    if body.startswith("[", position):
        position = skip_space(body, position + 1)
    if not body.startswith("{", position):
        return None
    position, name = position + 1, None
    while True:
        position = skip_space(body, position)
        if body.startswith(",", position):
            position = skip_space(body, position + 1)
        try:
            key, position = STRICT_JSON.raw_decode(body, position)
        except ValueError:
            return None
        position = skip_space(body, position)
        if not isinstance(key, str) or not body.startswith(":", position):
            return None
        position = skip_space(body, position + 1)
        if key in keys.arguments and name is not None and body.startswith("{", position):
            return PartialCall(name, settled_prefix(body[position:]))
        if keys.name_is_key and key and key not in (*keys.name, *keys.arguments) and body.startswith("{", position):
            return PartialCall(key, settled_prefix(body[position:]))
        try:
            value, position = STRICT_JSON.raw_decode(body, position)
        except ValueError:
            return None
        if key in keys.name and isinstance(value, str) and value:
            name = value


# --- text ------------------------------------------------------------------------------------


def first_of(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str | None]:
    """The first of `markers` in `text` from `start`: (where, which), or (-1, None)."""
    best, found = -1, None
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, marker
    return best, found


def without(text: str, markers: Sequence[str]) -> str:
    """`text` with every one of `markers` taken out."""
    if not markers:
        return text
    return re.sub("|".join(re.escape(marker) for marker in sorted(markers, key=len, reverse=True)), "", text)


def json_list_calls(body: str, context: ParseContext) -> tuple[Call, ...] | None:
    """A section's body that is a JSON list (or one object) of {"name", "arguments"} calls."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return named_calls(value, "name", ("arguments",))
