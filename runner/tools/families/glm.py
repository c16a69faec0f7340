"""GLM 4.5 / 4.6 / 4.7 / 5.x (and the templates that copied its format: Spark 2.5, Ling 3.0,
poolside Laguna): one call per <tool_call> element, the function's name first, then each
argument as a key element and a value element; reasoning in <think>...</think>.

GLM-4.5 and 4.6 put newlines between the parts:

    <think>Need the weather.</think>
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7 and 5.x write the same thing compact, and their prompt opens the reasoning for the
model (it ends with `<|assistant|><think>`), so the output starts inside it:

    Need the weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

Values are written raw: a string as its text (no quotes, no escaping), anything else as JSON, so
the tool's schema says which a value is (`typed_value`): "3" is 3 for an integer parameter and
"3" for a string one. A value is never trimmed (whitespace in it is the model's).
"""

from __future__ import annotations

import re

from ..family import (CONTENT, CUT_OFF, Call, CallSyntax, Family, FamilyParse, Open, ParseContext, PartialCall,
                      Segment, Text, arguments_json, held_back, leading_reasoning, property_schema, reread_pace,
                      skip_space, string_value_partial, then, typed_value)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
# The role tokens that end a turn (stop tokens), and a stray </think> (a prompt that already
# closed the reasoning): markers the model may write where content goes, never content.
STRAY = ("<|endoftext|>", "<|user|>", "<|observation|>", "<|assistant|>", "<|system|>", THINK_CLOSE)
MARKERS = (CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE, THINK_OPEN, THINK_CLOSE, *STRAY)
CONTENT_HOLD = (CALL_OPEN, *STRAY)
STRAY_PATTERN = re.compile("|".join(re.escape(marker) for marker in STRAY))  # what text in content may be the start of

MALFORMED = "the model's tool call is not in GLM's <tool_call> format"


class _Pending(Exception):
    """The text so far ends inside a call: more text decides it (`partial`: the call as far as
    it settled, while a string value is written)."""

    def __init__(self, partial: PartialCall | None = None) -> None:
        super().__init__()
        self.partial = partial


class _Malformed(Exception):
    """The call cannot be read (a cut-off one when `reason` is CUT_OFF)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# After a call that cannot be read, the rest of the output is content as written.
RAW = "raw"


def parse(text: str, context: ParseContext) -> FamilyParse:
    if context.state == RAW:
        return FamilyParse((Text(text),), open=Open(len(text), RAW, Text, ()))
    # Where the prompt opened the reasoning the model may still write <think> itself: text that
    # may be its start waits like the closer's.
    reasoning, body = leading_reasoning(text, context, THINK_OPEN, (THINK_CLOSE,), held=(THINK_OPEN, CALL_OPEN))
    if body is None:
        return reasoning
    return then(reasoning, body, _parse_body(text[body:], context))


def _parse_body(text: str, context: ParseContext) -> FamilyParse:
    """Content and calls after the reasoning."""
    segments: list[Segment] = []
    position = 0
    while True:
        start = text.find(CALL_OPEN, position)
        if start < 0:
            at = len(text) if context.final else len(text) - held_back(text[position:], CONTENT_HOLD)
            segments.append(Text(_content(text[position:at])))
            return FamilyParse(tuple(segments), open=Open(at, CONTENT, Text, CONTENT_HOLD))
        segments.append(Text(_content(text[position:start])))
        try:
            call, position = _read_call(text, start + len(CALL_OPEN), context)
        except _Pending as pending:  # read again at a pace (a string value's text streams) or at a closer
            partial = () if pending.partial is None else (pending.partial,)
            return FamilyParse((*segments, *partial), open=Open(start, CONTENT, None, (CALL_CLOSE, CALL_OPEN),
                                                                 reread_after=reread_pace(pending.partial)))
        except _Malformed as problem:
            if problem.reason == CUT_OFF:  # a call cut off by the end of the output was a call: dropped
                return FamilyParse(tuple(segments), CUT_OFF)
            # The raw text of the call (and all after it) is content, unchanged.
            segments.append(Text(text[start:]))
            return FamilyParse(tuple(segments), problem.reason, Open(len(text), RAW, Text, ()))
        segments.append(call)


def _read_call(text: str, position: int, context: ParseContext) -> tuple[Call, int]:
    """The call whose name starts at `position` and the position after its </tool_call>."""
    name_end = _first_of(text, (KEY_OPEN, CALL_CLOSE), position)
    if name_end < 0:
        raise _unfinished(context)
    name = text[position:name_end].strip()
    if not re.fullmatch(r'[^\s<>{}"]+', name):  # not a function's name (a JSON call, another format)
        raise _Malformed(MALFORMED)
    schema = context.schema_of(name)
    arguments: dict = {}
    position = name_end
    while True:
        position = skip_space(text, position)
        if text.startswith(CALL_CLOSE, position):
            return Call(name, arguments_json(arguments)), position + len(CALL_CLOSE)
        if not text.startswith(KEY_OPEN, position):
            raise _unexpected(text, position, (CALL_CLOSE, KEY_OPEN), context)
        try:
            key, value, position, call_closed = _read_argument(text, position + len(KEY_OPEN), context)
        except _Pending:
            raise _Pending(_partial(text, position + len(KEY_OPEN), name, arguments, schema)) from None
        arguments[key] = typed_value(value, property_schema(schema, key))
        if call_closed:
            return Call(name, arguments_json(arguments)), position


def _read_argument(text: str, position: int, context: ParseContext) -> tuple[str, str, int, bool]:
    """(key, raw value, the position after the argument, whether </tool_call> ended it too)."""
    key_end = text.find(KEY_CLOSE, position)
    if key_end < 0:
        raise _unfinished(context)
    key = text[position:key_end].strip()
    position = skip_space(text, key_end + len(KEY_CLOSE))
    if not text.startswith(VALUE_OPEN, position):
        raise _unexpected(text, position, (VALUE_OPEN,), context)
    value_start = position + len(VALUE_OPEN)
    value_end, after, call_closed = _value_end(text, value_start, context)
    return key, text[value_start:value_end], after, call_closed


def _partial(text: str, position: int, name: str, arguments: dict, schema) -> PartialCall | None:
    """The call as far as it settled while the argument from `position` (after <arg_key>) is
    being written: where its value is a string, the JSON of the values before it and of its text
    so far, up to the first closer in it (which may end it) or what may begin one (a prefix of
    the call's arguments); None before its value starts, or for a value of another type."""
    key_end = text.find(KEY_CLOSE, position)
    value = -1 if key_end < 0 else skip_space(text, key_end + len(KEY_CLOSE))
    key = text[position:key_end].strip()
    if value < 0 or not text.startswith(VALUE_OPEN, value) or property_schema(schema, key).get("type") != "string":
        return None
    raw = text[value + len(VALUE_OPEN):]
    closer = _first_of(raw, (VALUE_CLOSE, CALL_CLOSE), 0)
    raw = raw[:closer] if closer >= 0 else raw[:len(raw) - held_back(raw, (VALUE_CLOSE, CALL_CLOSE))]
    return string_value_partial(name, arguments, key, raw)


def _value_end(text: str, start: int, context: ParseContext) -> tuple[int, int, bool]:
    """Where a value ends: (its end, the position after its closer, whether that closer was the
    call's own).

    A value may hold marker text (a file about this format), so a closer counts only where what
    follows it fits the format: </arg_value> before the next <arg_key> or the </tool_call>. A
    model that forgot the last </arg_value> ends the value with </tool_call>, which counts where
    the output ends after it or the next call follows."""
    for match in re.finditer(re.escape(VALUE_CLOSE) + "|" + re.escape(CALL_CLOSE), text[start:]):
        closer_end = start + match.end()
        following = text[closer_end:].lstrip()
        expected = (KEY_OPEN, CALL_CLOSE) if match.group() == VALUE_CLOSE else (CALL_OPEN,)
        if any(following.startswith(marker) for marker in expected):
            return start + match.start(), closer_end, match.group() == CALL_CLOSE
        if not context.final and any(marker.startswith(following) for marker in expected):
            raise _Pending()  # what follows the closer has not come yet
        if context.final and not following and match.group() == CALL_CLOSE:
            return start + match.start(), closer_end, True
    raise _unfinished(context)


def _unexpected(text: str, position: int, expected: tuple[str, ...], context: ParseContext) -> Exception:
    """The error for text where one of `expected` should be: pending while it may still come."""
    rest = text[position:]
    if not context.final and any(marker.startswith(rest) for marker in expected):
        return _Pending()
    return _Malformed(CUT_OFF if not rest else MALFORMED)


def _unfinished(context: ParseContext) -> Exception:
    return _Malformed(CUT_OFF) if context.final else _Pending()


def _first_of(text: str, markers: tuple[str, ...], position: int) -> int:
    found = [index for index in (text.find(marker, position) for marker in markers) if index >= 0]
    return min(found) if found else -1


def _content(text: str) -> str:
    """Content less the stray markers, in one pass (what is left of two is never read as a third)."""
    return STRAY_PATTERN.sub("", text)


FAMILY = Family(
    name="glm",
    description="<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call> "
                "(GLM 4.5 to 5.x; 4.5/4.6 with newlines), reasoning in <think>...</think>",
    parse=parse,
    fingerprints=(("<tool_call>", "<arg_key>", "<arg_value>"),),
    markers=MARKERS,
    reasoning=(THINK_OPEN, THINK_CLOSE),
    priority=30,  # before hermes (80): GLM's templates also write <tool_call>
    # How the template writes a call's parts (the parse reads both alike; the grammar writes
    # calls the way the model has seen them).
    variants={"glm47-compact": ("</arg_key><arg_value>",), "glm45-newline": ("</arg_key>\n<arg_value>",)},
    call_syntax=CallSyntax(call_open=CALL_OPEN + "{name}", call_close=CALL_CLOSE,
                           parameter_open=KEY_OPEN + "{key}" + KEY_CLOSE + VALUE_OPEN, parameter_close=VALUE_CLOSE),
    variant_call_syntax={
        "glm45-newline": CallSyntax(call_open=CALL_OPEN + "{name}\n", call_close=CALL_CLOSE, separator="\n",
                                    parameter_open=KEY_OPEN + "{key}" + KEY_CLOSE + "\n" + VALUE_OPEN,
                                    parameter_close=VALUE_CLOSE + "\n"),
    },
)
