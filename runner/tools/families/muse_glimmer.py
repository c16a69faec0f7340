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

from ..family import (CONTENT, CUT_OFF, REASONING, Call, CallSyntax, Family, FamilyParse, Open, ParseContext, PartialCall,
                      Segment, Text, Thought, arguments_json, first_found, held_back, may_begin, property_schema, read_turn,
                      reread_pace, string_value_partial)
from ..partial_json import settled_prefix
from ._marked_calls import JSON_ENDS, JsonBroken, JsonCutOff, arguments_of, json_value_at, skip_space
from ._xml_calls import parameter_value, schema_types

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

# Where a parse goes on from, besides the output's start (None): inside the body of an answer
# (CONTENT) or of a reasoning message (REASONING), at a message's header, or just after a
# message (where its <|eom|> may follow).
HEADER = "header"
AFTER_MESSAGE = "after message"

_HEADER = re.compile(r"\s*(?:to=([^\s<]+))?\s*" + re.escape(MESSAGE))
_RECIPIENT_SO_FAR = re.compile(r"\s*to=[^\s<]*\s*")
_TAG_NAME = re.compile(r'([^"<>\n]*)"\s*>')


@dataclass(frozen=True)
class _Header:
    recipient: str | None  # None: no recipient (the answer)
    body: int  # where the message's body starts


class _Waiting(Exception):
    """The text ends inside the message's calls: more may complete them (`partial`: its first
    call as far as it settled, while its arguments are written)."""

    def __init__(self, partial: PartialCall | None = None) -> None:
        super().__init__()
        self.partial = partial


class _Broken(Exception):
    """The body is not a call in the format."""


def parse(text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, (END_OF_TURN,), _parse_turn)


def _parse_turn(text: str, context: ParseContext) -> FamilyParse:
    """The messages from where the text starts: a header (the output's start, where the prompt
    may have opened a reasoning message), a body, or just after a message."""
    segments: list[Segment] = []
    error = None
    position = 0
    state = context.state
    if state is None:
        # A prompt that ended inside a reasoning message: the output starts in its body.
        state = REASONING if context.reasoning_open else HEADER
    while True:
        if state in (CONTENT, REASONING):  # a text message's body, up to its end
            end, _ = first_found(text, BODY_ENDS, position)
            piece = Thought if state == REASONING else Text
            if end < 0:
                # Text that may begin a message's end waits.
                at = len(text) if context.final else len(text) - held_back(text[position:], BODY_ENDS)
                segments.append(piece(text[position:at]))
                return _parse(segments, error, context, Open(at, state, piece, BODY_ENDS))
            segments.append(piece(text[position:end]))
            position, state = end, AFTER_MESSAGE
            continue
        header_at, header_state = position, state
        if state == AFTER_MESSAGE:
            after = _after_message(text, position)
            if after == position and not context.final and _may_end_message(text, position):
                # Its <|eom|> (after spaces) may still come, which the header does not read.
                return _parse(segments, error, context, Open(position, AFTER_MESSAGE))
            if after != position:
                header_at, header_state = after, HEADER
            position = after
        if position == len(text):  # the next message has not begun
            return _parse(segments, error, context, Open(header_at, header_state))
        header = _header_at(text, position, context.final)
        if header == "wait":  # read again from the header at every piece, until it is whole
            return _parse(segments, error, context, Open(header_at, header_state))
        if header == "bare":  # a message the model wrote without a header: the answer
            header = _Header(None, _past_start(text, position))
        if header.recipient in (None, ANSWER_RECIPIENT, REASONING_RECIPIENT):
            position, state = header.body, REASONING if header.recipient == REASONING_RECIPIENT else CONTENT
            continue
        end, problem, stops = _call_message(text, position, header, context, segments)
        error = problem or error
        if end is None:  # not ended yet: read again from its header when one of `stops` comes (or at a pace: it streams)
            partial = segments[-1] if segments and isinstance(segments[-1], PartialCall) else None
            pace = reread_pace(partial) if stops else 0
            return _parse(segments, error, context, Open(header_at, header_state, None, stops, reread_after=pace))
        position, state = end, AFTER_MESSAGE


def _parse(segments: list[Segment], error: str | None, context: ParseContext, opened: Open) -> FamilyParse:
    kept = tuple(segment for segment in segments if not isinstance(segment, (Text, Thought)) or segment.text)
    return FamilyParse(kept, error, None if context.final else opened)


def _may_end_message(text: str, position: int) -> bool:
    """Whether the text from `position` (spaces, and the start of <|eom|>) may still grow into
    the end of a message that `_after_message` reads."""
    return may_begin(text, skip_space(text, position), (END_OF_MESSAGE,))


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


def _after_message(text: str, position: int) -> int:
    """Past the end of a message (its <|eom|>, and whitespace before it)."""
    after = skip_space(text, position)
    return after + len(END_OF_MESSAGE) if text.startswith(END_OF_MESSAGE, after) else position


def _call_message(text: str, start: int, header: _Header, context: ParseContext,
                  segments: list[Segment]) -> tuple[int | None, str | None, tuple[str, ...] | None]:
    """A message addressed to a tool, from its header's start: its calls (onto `segments`),
    where it ends (None: not yet, and then the strings without which it stays so), and why it
    is content (None: it is not)."""
    try:
        calls, end = _calls_at(text, header.body, header.recipient, context)
    except _Waiting as waiting:
        if not context.final:
            if waiting.partial is not None:
                segments.append(waiting.partial)
            return None, None, _closers(text, header.body)
        return len(text), CUT_OFF, None  # a call cut off by the end of the output: dropped
    except _Broken:
        end, _ = first_found(text, BODY_ENDS, header.body)
        if end < 0 and not context.final:
            return None, None, BODY_ENDS  # where the unreadable message ends is not known yet
        end = end if end >= 0 else len(text)
        segments.append(Text(text[start:end]))  # the raw text, as the model wrote it
        return end, UNREADABLE, None
    segments.extend(calls)
    return end, None, None


def _closers(text: str, body: int) -> tuple[str, ...] | None:
    """What may end a call's body that has not ended: the bracket that may close its JSON, or
    the markup's close; a message's end, where it turns out to be no call (None: what the body
    is, is not known yet)."""
    begins = skip_space(text, body)
    if text.startswith("{", begins):
        return (*JSON_ENDS, *BODY_ENDS)
    if text.startswith(CALLS_OPEN, begins):
        return (CALLS_CLOSE, *BODY_ENDS)
    return None


def _calls_at(text: str, position: int, recipient: str, context: ParseContext) -> tuple[list[Call], int]:
    """The calls of a message's body: ATEM markup, or (a model that wrote JSON) the recipient's
    arguments as one JSON object."""
    position = skip_space(text, position)
    if text.startswith("{", position):
        if isinstance(json_value_at(text, position), JsonCutOff):  # its arguments stream, normalized
            raise _Waiting(PartialCall(recipient, settled_prefix(text[position:])))
        return [_json_call(text, position, recipient)], _end_of_json(text, position)
    if not text.startswith(CALLS_OPEN, position):
        raise _Waiting if may_begin(text, position, (CALLS_OPEN,)) else _Broken
    position += len(CALLS_OPEN)
    calls = []
    while True:
        position = skip_space(text, position)
        if text.startswith(INVOKE_OPEN, position):
            try:
                call, position = _invoke_at(text, position + len(INVOKE_OPEN), context)
            except _Waiting as waiting:  # only a message's first call streams (its calls go out together)
                raise _Waiting(None if calls else waiting.partial) from None
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
                if schema_types(property_schema(schema, key)) != {"string"}:
                    raise _Waiting
                raw = text[position:len(text) - held_back(text[position:], (PARAMETER_CLOSE,))]
                raise _Waiting(string_value_partial(name, arguments, key, raw))
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
