"""Tencent Hunyuan 3 (Hy3): GLM-like calls in a block, every marker a token with the template's
`HYTK` suffix (`:opensource`), reasoning in <think:opensource>:

    <think:opensource>The user wants the weather.</think:opensource>Let me check.<tool_calls:opensource>
    <tool_call:opensource>get_weather<tool_sep:opensource>
    <arg_key:opensource>city</arg_key:opensource>
    <arg_value:opensource>Paris</arg_value:opensource>
    </tool_call:opensource>
    </tool_calls:opensource><｜hy_eos:opensource｜>

A value is raw text for a string and JSON otherwise (the template writes non-strings with
tojson); the tool's schema types it. The generation prompt opens the reasoning
(`<｜hy_Assistant:opensource｜><think:opensource>`, reasoning_effort low or high) or writes an
empty block (no_think, the default); a call block also ends reasoning the model never closed.
The turn ends at the end-of-sentence token.
"""

from __future__ import annotations

from ..family import (CUT_OFF, Call, CallSyntax, Family, FamilyParse, ParseContext, PartialCall, leading_reasoning, then,
                      arguments_json, held_back, may_begin, property_schema, read_turn, string_value_partial)
from ._marked_calls import Calls, Unreadable, content_and_calls, skip_space, section_reader
from ._xml_calls import parameter_value, schema_types

HYTK = ":opensource"  # the template's suffix of every special token


def _tag(name: str) -> str:
    return f"<{name}{HYTK}>"


THINK_OPEN, THINK_CLOSE = _tag("think"), _tag("/think")
CALLS_OPEN, CALLS_CLOSE = _tag("tool_calls"), _tag("/tool_calls")
CALL_OPEN, CALL_CLOSE = _tag("tool_call"), _tag("/tool_call")
SEPARATOR = _tag("tool_sep")
KEY_OPEN, KEY_CLOSE = _tag("arg_key"), _tag("/arg_key")
VALUE_OPEN, VALUE_CLOSE = _tag("arg_value"), _tag("/arg_value")
END_OF_SENTENCE = f"<｜hy_eos{HYTK}｜>"
ROLE_TOKENS = (f"<｜hy_Assistant{HYTK}｜>", f"<｜hy_User{HYTK}｜>")  # a new turn: the output ended
END_TOKENS = (END_OF_SENTENCE, *ROLE_TOKENS)
REASONING_MODE = f"<｜reasoning_mode{HYTK}｜>"
MARKERS = (THINK_OPEN, THINK_CLOSE, CALLS_OPEN, CALLS_CLOSE, CALL_OPEN, CALL_CLOSE, SEPARATOR, KEY_OPEN, KEY_CLOSE,
           VALUE_OPEN, VALUE_CLOSE, REASONING_MODE, *END_TOKENS)
UNREADABLE = "the model's tool call could not be read"


def parse(text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, END_TOKENS, _parse_turn)


def _parse_turn(text: str, context: ParseContext) -> FamilyParse:
    # The end tokens never occur in the turn (cut above): passed so that their start waits.
    reasoning, body = leading_reasoning(text, context, THINK_OPEN, (THINK_CLOSE,),
                                        also_ending=(CALLS_OPEN, *END_TOKENS))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALLS_OPEN,), _read_block,
                                                       hidden=(*END_TOKENS, REASONING_MODE)))


class _Waiting(Exception):
    """The text ends inside the block: more may complete it (`partial`: its first call as far
    as it settled, while a string value is written)."""

    def __init__(self, partial: PartialCall | None = None) -> None:
        super().__init__()
        self.partial = partial


class _Broken(Exception):
    """The text is not a call block in the format."""


@section_reader((CALLS_CLOSE,))  # a block's calls come when it closes (or the output ends)
def _read_block(text: str, start: int, opener: str, context: ParseContext) -> Calls | Unreadable | None:
    """The call block from `start`: its calls, unreadable text, or None while it goes on."""
    try:
        calls, end = _calls_at(text, start + len(opener), context)
    except _Waiting as waiting:
        return Unreadable(CUT_OFF, len(text)) if context.final else waiting.partial
    except _Broken:
        close = text.find(CALLS_CLOSE, start)
        if close < 0:
            return Unreadable(UNREADABLE, len(text)) if context.final else None
        return Unreadable(UNREADABLE, close + len(CALLS_CLOSE))
    return Calls(tuple(calls), end)


def _calls_at(text: str, position: int, context: ParseContext) -> tuple[list[Call], int]:
    calls = []
    while True:
        position = skip_space(text, position)
        if text.startswith(CALL_OPEN, position):
            try:
                call, position = _call_at(text, position + len(CALL_OPEN), context)
            except _Waiting as waiting:  # only a block's first call streams (its calls go out together)
                raise _Waiting(None if calls else waiting.partial) from None
            calls.append(call)
        elif text.startswith(CALLS_CLOSE, position) and calls:
            return calls, position + len(CALLS_CLOSE)
        elif position == len(text) and calls and context.final:
            return calls, position  # the block's close left out at the end of the turn
        elif may_begin(text, position, (CALL_OPEN, CALLS_CLOSE)):
            raise _Waiting
        else:
            raise _Broken


def _call_at(text: str, position: int, context: ParseContext) -> tuple[Call, int]:
    """One call from after its <tool_call> token: the call and where its close ends."""
    separator = text.find(SEPARATOR, position)
    name_end = len(text) if separator < 0 else separator
    name = text[position:name_end].strip()
    if "<" in name or "\n" in name or (separator >= 0 and not name):
        raise _Broken
    if separator < 0:
        raise _Waiting
    schema = context.schema_of(name)
    arguments = {}
    position = separator + len(SEPARATOR)
    while True:
        position = skip_space(text, position)
        if text.startswith(KEY_OPEN, position):
            key, position = _between(text, position + len(KEY_OPEN), KEY_CLOSE)
            position = skip_space(text, position)
            if not text.startswith(VALUE_OPEN, position):
                raise _Waiting if may_begin(text, position, (VALUE_OPEN,)) else _Broken
            value_start = position + len(VALUE_OPEN)
            if text.find(VALUE_CLOSE, value_start) < 0 and schema_types(property_schema(schema, key.strip())) == {"string"}:
                raw = text[value_start:len(text) - held_back(text[value_start:], (VALUE_CLOSE,))]
                raise _Waiting(string_value_partial(name, arguments, key.strip(), raw))
            raw, position = _between(text, value_start, VALUE_CLOSE)
            arguments[key.strip()] = parameter_value(raw, property_schema(schema, key.strip()))
        elif text.startswith(CALL_CLOSE, position):
            return Call(name, arguments_json(arguments)), position + len(CALL_CLOSE)
        elif may_begin(text, position, (KEY_OPEN, CALL_CLOSE)):
            raise _Waiting
        else:
            raise _Broken


_read_block.streams_calls = True  # its first call's string values stream: read again at a pace


def _between(text: str, position: int, closer: str) -> tuple[str, int]:
    end = text.find(closer, position)
    if end < 0:
        raise _Waiting
    return text[position:end], end + len(closer)


FAMILY = Family(
    name="hy3",
    description="<tool_calls:opensource><tool_call:opensource>NAME<tool_sep:opensource>"
                "<arg_key:opensource>KEY</arg_key:opensource><arg_value:opensource>VALUE</arg_value:opensource>..."
                "</tool_call:opensource></tool_calls:opensource> (Tencent Hunyuan 3)",
    parse=parse,
    # The template builds its tokens from HYTK; these pieces are in its text.
    fingerprints=(("hy_Assistant", "'<tool_sep{}>'.format(HYTK)"), ("<｜hy_Assistant:opensource｜>", SEPARATOR)),
    markers=MARKERS,
    reasoning=(THINK_OPEN, THINK_CLOSE),
    priority=30,  # before hermes and the generic format
    # Constrained calls as the template writes them back into the history.
    call_syntax=CallSyntax(block_open=CALLS_OPEN + "\n", call_open=CALL_OPEN + "{name}" + SEPARATOR + "\n",
                           call_close=CALL_CLOSE + "\n", block_close=CALLS_CLOSE,
                           parameter_open=KEY_OPEN + "{key}" + KEY_CLOSE + "\n" + VALUE_OPEN,
                           parameter_close=VALUE_CLOSE + "\n"),
)
