"""Muse Glimmer: gpt-oss-like messages addressed by recipient, calls as ATEM markup.

The generation prompt is `<|start|>assistant`; the model writes the rest of each message's
header (` to=RECIPIENT`), `<|message|>`, the body, and `<|eom|>` (more messages follow) or
`<|eot|>` (the turn ends):

     to=self<|message|>The user wants the weather.<|eom|><|start|>assistant to=get_weather<|message|>
    <atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>

The recipient says what a message is: `self` is reasoning, `user` (or none) the answer, any
other a call whose body is the markup (the function's name is the invoke's). Values are raw
text for strings and JSON otherwise, typed by the tool's schema. Markup inside reasoning or an
answer is text (llama.cpp's reading: a call is only a message addressed to a tool).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..family import (CUT_OFF, Call, CallSyntax, Family, FamilyParse, ParseContext, Segment, Text, Thought,
                      arguments_json, may_begin, property_schema, settled_text, until_turn_end)
from ._marked_calls import JsonBroken, JsonCutOff, arguments_of, json_value_at, skip_space
from ._xml_calls import parameter_value

START, MESSAGE, END_OF_MESSAGE, END_OF_TURN = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
HEADER_START = START + "assistant"  # the generation prompt; the model writes it for every later message
CALLS_OPEN, CALLS_CLOSE = "<atem:function_calls>", "</atem:function_calls>"
INVOKE_OPEN, INVOKE_CLOSE = '<atem:invoke name="', "</atem:invoke>"
PARAMETER_OPEN, PARAMETER_CLOSE = '<atem:parameter name="', "</atem:parameter>"
MARKERS = (START, MESSAGE, END_OF_MESSAGE, END_OF_TURN, CALLS_OPEN, CALLS_CLOSE, "<atem:invoke", INVOKE_CLOSE,
           "<atem:parameter", PARAMETER_CLOSE)
REASONING_RECIPIENT, ANSWER_RECIPIENT = "self", "user"
BODY_ENDS = (END_OF_MESSAGE, END_OF_TURN, START)  # a text message runs until one of them
UNREADABLE = "the model's tool call could not be read"

_HEADER = re.compile(r"\s*(?:to=([^\s<]+))?\s*" + re.escape(MESSAGE))
_RECIPIENT_SO_FAR = re.compile(r"\s*to=[^\s<]*\s*")
_TAG_NAME = re.compile(r'([^"<>\n]*)"\s*>')


@dataclass(frozen=True)
class _Header:
    recipient: str | None  # None: no recipient (the answer)
    body: int  # where the message's body starts


class _Waiting(Exception):
    """The text ends inside the markup: more may complete it."""


class _Broken(Exception):
    """The body is not a call in the format."""


def parse(text: str, context: ParseContext) -> FamilyParse:
    text, context = until_turn_end(text, context, (END_OF_TURN,))
    segments: list[Segment] = []
    error = None
    position = 0
    # A prompt that ended inside a reasoning message: the output starts in its body.
    header: _Header | str | None = _Header(REASONING_RECIPIENT, 0) if context.reasoning_open else None
    while position < len(text) or header is not None:
        if header is None:
            header = _header_at(text, position, context.final)
        if header == "wait":
            break
        if header == "bare":  # a message the model wrote without a header: the answer
            header = _Header(None, _past_start(text, position))
        if header.recipient in (None, ANSWER_RECIPIENT, REASONING_RECIPIENT):
            piece, position = _text_body(text, header.body, context)
            segments.append(Thought(piece) if header.recipient == REASONING_RECIPIENT else Text(piece))
        else:
            position, problem = _call_message(text, position, header, context, segments)
            error = problem or error
        if position is None:
            break
        position, header = _after_message(text, position), None
    return FamilyParse(tuple(segment for segment in segments if not isinstance(segment, (Text, Thought))
                             or segment.text), error)


def _header_at(text: str, position: int, final: bool) -> _Header | str:
    """The header of the message from `position` (after an optional `<|start|>assistant`):
    "wait" while it may still become one, "bare" when the text is no header."""
    if text.startswith(HEADER_START, position):
        position += len(HEADER_START)
    elif not final and HEADER_START.startswith(text[position:]):
        return "wait"
    found = _HEADER.match(text, position)
    if found is not None:
        return _Header(found.group(1), found.end())
    if not final and _may_be_header(text[position:]):
        return "wait"
    return "bare"


def _past_start(text: str, position: int) -> int:
    """Past a message's start token, if one is there (the body of a message without a header
    begins after it: every message consumes some text)."""
    for start in (HEADER_START, START):
        if text.startswith(start, position):
            return position + len(start)
    return position


def _may_be_header(text: str) -> bool:
    """Whether `text` (the rest of the output) may still grow into ` to=RECIPIENT<|message|>`."""
    recipient = _RECIPIENT_SO_FAR.match(text)
    rest = text[recipient.end():] if recipient else text.lstrip()
    return (not recipient and "to=".startswith(rest)) or MESSAGE.startswith(rest)


def _text_body(text: str, start: int, context: ParseContext) -> tuple[str, int | None]:
    """A text message's body from `start` and where it ends (None: it has not)."""
    ends = [index for index in (text.find(marker, start) for marker in BODY_ENDS) if index >= 0]
    if ends:
        return text[start:min(ends)], min(ends)
    return settled_text(text[start:], context, BODY_ENDS), (len(text) if context.final else None)


def _after_message(text: str, position: int) -> int:
    """Past the end of a message (its <|eom|>, and whitespace before it)."""
    after = skip_space(text, position)
    return after + len(END_OF_MESSAGE) if text.startswith(END_OF_MESSAGE, after) else position


def _call_message(text: str, start: int, header: _Header, context: ParseContext,
                  segments: list[Segment]) -> tuple[int | None, str | None]:
    """A message addressed to a tool, from its header's start: its calls (onto `segments`),
    where it ends (None: not yet), and why it is content (None: it is not)."""
    try:
        calls, end = _calls_at(text, header.body, header.recipient, context)
    except _Waiting:
        if not context.final:
            return None, None
        segments.append(Text(text[start:]))  # the raw text, as the model wrote it
        return len(text), CUT_OFF
    except _Broken:
        ends = [index for index in (text.find(marker, header.body) for marker in BODY_ENDS) if index >= 0]
        if not ends and not context.final:
            return None, None  # where the unreadable message ends is not known yet
        end = min(ends) if ends else len(text)
        segments.append(Text(text[start:end]))
        return end, UNREADABLE
    segments.extend(calls)
    return end, None


def _calls_at(text: str, position: int, recipient: str, context: ParseContext) -> tuple[list[Call], int]:
    """The calls of a message's body: ATEM markup, or (a model that wrote JSON) the recipient's
    arguments as one JSON object."""
    position = skip_space(text, position)
    if text.startswith("{", position):
        return [_json_call(text, position, recipient)], _end_of_json(text, position)
    if not text.startswith(CALLS_OPEN, position):
        raise _Waiting if may_begin(text, position, (CALLS_OPEN,)) else _Broken
    position += len(CALLS_OPEN)
    calls = []
    while True:
        position = skip_space(text, position)
        if text.startswith(INVOKE_OPEN, position):
            call, position = _invoke_at(text, position + len(INVOKE_OPEN), context)
            calls.append(call)
        elif text.startswith(CALLS_CLOSE, position) and calls:
            return calls, position + len(CALLS_CLOSE)
        elif may_begin(text, position, (INVOKE_OPEN, CALLS_CLOSE)):
            raise _Waiting
        else:
            raise _Broken


def _json_call(text: str, position: int, recipient: str) -> Call:
    found = json_value_at(text, position)
    if isinstance(found, JsonCutOff):
        raise _Waiting
    if isinstance(found, JsonBroken):
        raise _Broken
    arguments = arguments_of(found[0]) if isinstance(found[0], dict) else None
    if arguments is None:
        raise _Broken
    return Call(recipient, arguments)


def _end_of_json(text: str, position: int) -> int:
    return json_value_at(text, position)[1]


def _invoke_at(text: str, position: int, context: ParseContext) -> tuple[Call, int]:
    """One invoke from after `<atem:invoke name="`: its call and where its close ends."""
    name, position = _tag_name(text, position)
    schema = context.schema_of(name)
    arguments = {}
    while True:
        position = skip_space(text, position)
        if text.startswith(PARAMETER_OPEN, position):
            key, position = _tag_name(text, position + len(PARAMETER_OPEN))
            end = text.find(PARAMETER_CLOSE, position)
            if end < 0:
                raise _Waiting
            arguments[key] = parameter_value(text[position:end], property_schema(schema, key))
            position = end + len(PARAMETER_CLOSE)
        elif text.startswith(INVOKE_CLOSE, position):
            return Call(name, arguments_json(arguments)), position + len(INVOKE_CLOSE)
        elif may_begin(text, position, (PARAMETER_OPEN, INVOKE_CLOSE)):
            raise _Waiting
        else:
            raise _Broken


def _tag_name(text: str, position: int) -> tuple[str, int]:
    """The name after a tag's opening quote (`get_weather">`) and where the tag ends."""
    found = _TAG_NAME.match(text, position)
    if found is None:
        raise _Waiting if re.fullmatch(r'[^"<>\n]*"?\s*', text[position:]) else _Broken
    if not found.group(1):
        raise _Broken
    return found.group(1), found.end()


FAMILY = Family(
    name="muse-glimmer",
    description=' to=NAME<|message|><atem:function_calls><atem:invoke name="NAME">'
                '<atem:parameter name="KEY">VALUE</atem:parameter></atem:invoke></atem:function_calls><|eom|> '
                "(Muse Glimmer)",
    parse=parse,
    fingerprints=((CALLS_OPEN, END_OF_MESSAGE),),  # llama.cpp's detection
    markers=MARKERS,
    reasoning=(" to=self" + MESSAGE, END_OF_MESSAGE),
    priority=30,  # before the generic format
    # A constrained call: a message to the function, its markup; calls are separate messages.
    # The answer needs its own header, which free text in a grammar cannot hold: `auto` is free.
    call_syntax=CallSyntax(call_open=" to={name}" + MESSAGE + CALLS_OPEN + "\n" + INVOKE_OPEN + '{name}">\n',
                           call_close=INVOKE_CLOSE + "\n" + CALLS_CLOSE,
                           separator=END_OF_MESSAGE + HEADER_START,
                           parameter_open=PARAMETER_OPEN + '{key}">', parameter_close=PARAMETER_CLOSE + "\n",
                           reasoning=(" to=self" + MESSAGE, END_OF_MESSAGE + HEADER_START),
                           constrains_auto=False),
)
