"""OpenBMB MiniCPM5: calls as XML-like tags, one per function, reasoning in <think>:

    I'm thinking</think><function name="python"><param name="code">print('hey')</param></function>
    <function name="html"><param name="markup"><![CDATA[<a href="/x">hi</a>]]></param></function>

A value is the text up to </param>; a value holding <, & or a line break is wrapped in
<![CDATA[...]]> (the template does it), whose inner text is the value even where it holds
</param>. Values are typed by the tool's schema (`1` is 1 for an integer, "1" for a string).
Calls may follow some content and are separated by whitespace; the turn ends at <|im_end|>.
The template opens the reasoning in the prompt (`<think>\\n`) when thinking is on, and writes
an empty block (`<think>\\n\\n</think>\\n\\n`) when it is off; only </think> ends it (llama.cpp's
reading: a call inside unclosed reasoning is part of the reasoning).
"""

from __future__ import annotations

import re

from ..family import (CUT_OFF, Call, CallSyntax, Family, FamilyParse, ParseContext, PartialCall, leading_reasoning, then,
                      arguments_json, held_back, property_schema, read_turn, string_value_partial)
from ._marked_calls import Calls, Unreadable, content_and_calls, skip_space, section_reader
from ._xml_calls import parameter_value, schema_types

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FUNCTION_OPEN, FUNCTION_CLOSE = '<function name="', "</function>"
PARAM_OPEN, PARAM_CLOSE = '<param name="', "</param>"
CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"
END_TOKENS = ("<|im_end|>", "<|endoftext|>")  # the turn ends at the first of them
# "<function" and "<param" are tokens of the model's vocabulary (llama.cpp preserves them).
MARKERS = (THINK_OPEN, THINK_CLOSE, "<function", FUNCTION_CLOSE, "<param", PARAM_CLOSE, *END_TOKENS)
UNREADABLE = "the model's tool call could not be read"

_TAG_NAME = re.compile(r'([^"<>\n]*)"\s*>')  # the rest of a tag after its opening quote


def parse(text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, END_TOKENS, _parse_turn)


def _parse_turn(text: str, context: ParseContext) -> FamilyParse:
    # The end tokens never occur in the turn (cut above): passed so that their start waits.
    reasoning, body = leading_reasoning(text, context, THINK_OPEN, (THINK_CLOSE,), also_ending=END_TOKENS)
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (FUNCTION_OPEN,), _read_function,
                                                       hidden=END_TOKENS))


class _Waiting(Exception):
    """The text ends inside the call: more may complete it (`partial`: the call as far as it
    settled, while a string value is written)."""

    def __init__(self, partial: PartialCall | None = None) -> None:
        super().__init__()
        self.partial = partial


class _Broken(Exception):
    """The text is not a call in the format."""


@section_reader((FUNCTION_CLOSE,))  # a call comes when it closes (or the output ends)
def _read_function(text: str, start: int, opener: str, context: ParseContext) -> Calls | Unreadable | None:
    """One <function ...>...</function> from `start`: its call, unreadable text, or None while
    it has not ended."""
    try:
        call, end = _function_at(text, start + len(opener), context)
    except _Waiting as waiting:
        return Unreadable(CUT_OFF, len(text)) if context.final else waiting.partial
    except _Broken:
        close = text.find(FUNCTION_CLOSE, start)
        if close < 0:
            return Unreadable(UNREADABLE, len(text)) if context.final else None
        return Unreadable(UNREADABLE, close + len(FUNCTION_CLOSE))
    return Calls((call,), end)


def _function_at(text: str, position: int, context: ParseContext) -> tuple[Call, int]:
    name, position = _tag_name(text, position)
    schema = context.schema_of(name)
    arguments = {}
    while True:
        position = skip_space(text, position)
        if text.startswith(PARAM_OPEN, position):
            key, position = _tag_name(text, position + len(PARAM_OPEN))
            try:
                raw, position = _value_at(text, position)
            except _Waiting:
                raise _Waiting(_partial(text, position, name, arguments, key, schema)) from None
            arguments[key] = parameter_value(raw, property_schema(schema, key))
        elif text.startswith(FUNCTION_CLOSE, position):
            return Call(name, arguments_json(arguments)), position + len(FUNCTION_CLOSE)
        elif any(marker.startswith(text[position:]) for marker in (PARAM_OPEN, FUNCTION_CLOSE)):
            raise _Waiting
        else:
            raise _Broken


def _partial(text: str, position: int, name: str, arguments: dict, key: str, schema) -> PartialCall | None:
    """The call as far as it settled while the string value from `position` is written (plain,
    or inside CDATA): up to what may begin its close; None for a value of another type."""
    if schema_types(property_schema(schema, key)) != {"string"} or CDATA_OPEN.startswith(text[position:]):
        return None
    cdata = text.startswith(CDATA_OPEN, position)
    start, closer = (position + len(CDATA_OPEN), CDATA_CLOSE) if cdata else (position, PARAM_CLOSE)
    end = text.find(closer, start)  # (a CDATA block may be whole, its </param> still coming)
    raw = text[start:end] if end >= 0 else text[start:len(text) - held_back(text[start:], (closer,))]
    return string_value_partial(name, arguments, key, raw)


_read_function.streams_calls = True  # a string value streams: read again at a pace


def _tag_name(text: str, position: int) -> tuple[str, int]:
    """The name after a tag's opening quote (`python">`) and where the tag ends."""
    found = _TAG_NAME.match(text, position)
    if found is None:
        if re.fullmatch(r'[^"<>\n]*"?\s*', text[position:]):
            raise _Waiting
        raise _Broken
    if not found.group(1):
        raise _Broken
    return found.group(1), found.end()


def _value_at(text: str, position: int) -> tuple[str, int]:
    """A parameter's raw value from `position` (CDATA unwrapped) and where its </param> ends."""
    if text.startswith(CDATA_OPEN, position):
        end = text.find(CDATA_CLOSE, position + len(CDATA_OPEN))
        if end < 0:
            raise _Waiting
        after = end + len(CDATA_CLOSE)
        if text.startswith(PARAM_CLOSE, after):
            return text[position + len(CDATA_OPEN):end], after + len(PARAM_CLOSE)
        if PARAM_CLOSE.startswith(text[after:]):
            raise _Waiting
        raise _Broken
    if CDATA_OPEN.startswith(text[position:]) and text[position:]:
        raise _Waiting  # may be the start of a CDATA block
    end = text.find(PARAM_CLOSE, position)
    if end < 0:
        raise _Waiting
    return text[position:end], end + len(PARAM_CLOSE)


FAMILY = Family(
    name="minicpm5",
    description='<function name="NAME"><param name="KEY">VALUE</param></function> (OpenBMB MiniCPM5)',
    parse=parse,
    # The template's tool instructions (llama.cpp detects it by the same strings).
    fingerprints=(("Tool usage guidelines:", '<function name="', '<param name="'),),
    markers=MARKERS,
    reasoning=(THINK_OPEN, THINK_CLOSE),
    priority=30,  # before hermes and the generic format (its template holds <tools>, not <tool_call>)
    # Constrained calls as the template writes them back (raw strings: a value never holds
    # </param> in the grammar, so no CDATA is needed).
    call_syntax=CallSyntax(call_open='<function name="{name}">', call_close=FUNCTION_CLOSE, separator="\n",
                           parameter_open='<param name="{key}">', parameter_close=PARAM_CLOSE),
)
