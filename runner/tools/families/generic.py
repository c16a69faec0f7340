"""Templates that know no tools: the tools described in a system part, and the answer written as
{"tool_calls": [{"name": ..., "arguments": {...}}]} or {"response": "..."} (llama.cpp's Generic).

An output that starts with `{` is that object (what follows it is content); any other output is
content. The response is streamed as it is written, its JSON string decoded.
"""

from __future__ import annotations

import json

from ..family import CUT_OFF, Family, FamilyParse, Open, ParseContext, Segment, Text, reread_pace, skip_space, then
from ._json_calls import (BODY, JSON_CLOSERS, NOT_JSON, RAW, THINK_CLOSE, THINK_OPEN, Malformed, Pending, Progress,
                          call_array, call_object, excerpt, expect, in_body, json_call_syntax, lead, next_char,
                          next_key, read_raw, scan_value, skip_json_space)

CALLS_KEY, CALL_KEY, RESPONSE_KEY = "tool_calls", "tool_call", "response"
UNKNOWN = (f"the model's JSON output holds none of {CALLS_KEY!r}, {CALL_KEY!r} "
           f"and {RESPONSE_KEY!r}")
RESPONSE_NOT_STRING = f"the model's {RESPONSE_KEY!r} is not a JSON string"

# Inside the response's string (its text streams), and in the object after that string.
RESPONSE = "response"
AFTER_RESPONSE = "after response"
STRING_STOPS = ('"', "\\")  # what ends the response's string, or is not its text as written

LENIENT_JSON = json.JSONDecoder(strict=False)  # a response may hold raw newlines inside its string


def parse(text: str, context: ParseContext) -> FamilyParse:
    blocks = ((THINK_OPEN, THINK_CLOSE),) if context.reasons else ()
    reasoning, body = lead(text, context, blocks, settles=(), bare_call=_starts_object)
    if body is None:
        return reasoning
    return then(reasoning, body, _body(text[body:], context))


def _starts_object(text: str, position: int, final: bool) -> bool | None:
    if position >= len(text):
        return False if final else None
    return text[position] == "{"


def _body(text: str, context: ParseContext) -> FamilyParse:
    if context.state == RESPONSE:
        return _Object(text, 0, context).string_from(0)
    if context.state == AFTER_RESPONSE:
        return _Object(text, 0, context, after_response=True).members(0, is_first=False, is_known=True)
    if in_body(context):
        return read_raw(text, context)
    begins = skip_space(text, 0)
    starts = _starts_object(text, begins, context.final)
    if starts is None:
        return FamilyParse((), open=Open(0, BODY))
    if not starts:
        return read_raw(text, context)
    return _Object(text, begins, context).read()


class _Object:
    """{"tool_calls": [...]}, {"tool_call": {...}} or {"response": "text"}, from `start`; the
    text after it is content. `after_response`: read from just after the response's string."""

    def __init__(self, text: str, start: int, context: ParseContext, after_response: bool = False) -> None:
        self.text = text
        self.start = start
        self.context = context
        self.segments: list[Segment] = []
        self.after_response = after_response
        self.raw_start = start  # where the raw text of an object that cannot be read starts

    def read(self) -> FamilyParse:
        try:
            position = expect(self.text, self.start, "{", "'{'")
        except (Pending, Malformed) as problem:
            return self._failed(problem, Progress())
        return self.members(position, is_first=True, is_known=False)

    def members(self, position: int, is_first: bool, is_known: bool) -> FamilyParse:
        text, final = self.text, self.context.final
        progress = Progress()
        try:
            while True:
                key, position = next_key(text, position, is_first, final)
                if key is None:
                    break
                is_first = False
                if key == CALLS_KEY:
                    position = call_array(text, position, final, progress)
                elif key == CALL_KEY:
                    call, position = call_object(text, position, final)
                    progress.add(call, position)
                elif key == RESPONSE_KEY:
                    position = skip_json_space(text, position)
                    if next_char(text, position) != '"':
                        raise Malformed(RESPONSE_NOT_STRING)
                    self.segments.extend(progress.calls)
                    return self.string_from(position + 1)
                else:
                    _, position = scan_value(text, position, final)
                    continue
                is_known = True
            if not is_known:
                raise Malformed(UNKNOWN)
        except (Pending, Malformed) as problem:
            return self._failed(problem, progress)
        self.segments.extend(progress.calls)
        self._add_text(text[position:])  # what follows the object is content
        return self._parse(None, Open(len(text), RAW, Text, ()))

    def string_from(self, start: int) -> FamilyParse:
        """The response's string from `start` (inside it): its text, decoded escape by escape, is
        content as it comes; where an escape cannot be decoded, the text from there is content
        as written."""
        text = self.text
        end = _string_end(text, start)
        stop = end if end is not None else _whole_escapes_end(text, start, len(text))
        decoded, bad = _decoded(text[start:stop])
        self._add_text(decoded)
        if bad is not None:
            self._add_text(text[start + bad:])
            return self._parse(f"{NOT_JSON}: {bad_escape(text[start + bad:])}", Open(len(text), RAW, Text, ()))
        if end is None:
            return self._parse(CUT_OFF if self.context.final else None, Open(stop, RESPONSE, Text, STRING_STOPS))
        self.after_response, self.raw_start = True, end + 1  # the response is content already
        return self.members(end + 1, is_first=False, is_known=True)

    def _failed(self, problem: Exception, progress: Progress) -> FamilyParse:
        self.segments.extend(progress.calls)
        if isinstance(problem, Pending):
            if self.context.final:
                return self._parse(CUT_OFF, None)
            # Read again from the object's start (or from just after the response); inside a
            # call at every piece (its arguments stream), before one from its opening '{'.
            waits = None if progress.between_calls else (*JSON_CLOSERS, "{")
            repeats = len(progress.calls)
            if problem.partial is not None:
                self.segments.append(problem.partial)
            pace = reread_pace(problem.partial) if problem.in_call and waits is not None else 0
            if self.after_response:
                return self._parse(None, Open(self.raw_start, AFTER_RESPONSE, None, waits, repeats, pace))
            return self._parse(None, Open(self.start, BODY, None, waits, repeats, pace))
        self._add_text(self.text[self.raw_start if progress.after_last is None else progress.after_last:])
        return self._parse(problem.reason, Open(len(self.text), RAW, Text, ()))

    def _parse(self, error: str | None, opened: Open | None) -> FamilyParse:
        return FamilyParse(tuple(self.segments), error, None if self.context.final else opened)

    def _add_text(self, text: str) -> None:
        if text:
            self.segments.append(Text(text))


def _string_end(text: str, start: int) -> int | None:
    """Where the JSON string whose inside starts at `start` ends (its closing quote); None when
    the text ends inside it."""
    position = start
    while True:
        quote = text.find('"', position)
        if quote < 0:
            return None
        backslashes = 0
        while quote - backslashes - 1 >= start and text[quote - backslashes - 1] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return quote
        position = quote + 1


def _decoded(inside: str) -> tuple[str, int | None]:
    """A JSON string's inside decoded, and where an escape that cannot be decoded starts (None:
    there is none); the text before it decoded."""
    try:
        return LENIENT_JSON.decode(f'"{inside}"'), None
    except json.JSONDecodeError as problem:
        bad = inside.rfind("\\", 0, max(problem.pos - 1, 0) + 1)
        bad = bad if bad >= 0 else max(problem.pos - 1, 0)
        return _decoded(inside[:bad])[0], bad


def bad_escape(text: str) -> str:
    return f"an escape that cannot be decoded in {excerpt(text)}"


def _whole_escapes_end(text: str, start: int, stop: int) -> int:
    """The last position in text[start:stop] (a JSON string's inside) that cuts no escape and no
    surrogate pair written as two \\u escapes, so the text before it decodes on its own."""
    safe = position = start
    while position < stop:
        if text[position] != "\\":
            position += 1
            safe = position
            continue
        if position + 1 >= stop:
            break
        length = 6 if text[position + 1] == "u" else 2
        if position + length > stop:
            break
        if length == 6 and _is_high_surrogate_escape(text[position:position + length]):
            if position + 2 * length > stop:
                break
            length *= 2
        position += length
        safe = position
    return safe


def _is_high_surrogate_escape(escape: str) -> bool:
    try:
        return 0xD800 <= int(escape[2:], 16) <= 0xDBFF
    except ValueError:
        return False


FAMILY = Family(
    name="generic",
    description='{"tool_calls": [{"name": ..., "arguments": {...}}]} for templates that know no tools',
    parse=parse,
    priority=1000,  # never detected by a fingerprint: what is left
    legacy_format="generic",
    call_syntax=json_call_syntax(block_open='{"tool_calls": [', block_close="]}", separator=", ", leads=True),
    keeps_space_before_calls=False,
)
