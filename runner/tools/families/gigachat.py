"""Sber GigaChat 3 and 3.1: one call (the templates render only the first of a turn's calls) as
a JSON object of "name" and "arguments" after a marker, following the content.

GigaChat 3 writes the call as a message of its own, of the role `function call`:

    Let me look.<|message_sep|>

    function call<|role_sep|>
    {"name": "get_weather", "arguments": {"city": "Paris"}}

GigaChat 3.1 marks it with a token of its own:

    Let me look.<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}

<|message_sep|> ends a message: one that no function call follows ends the output (what would
follow is another role's message). The parse reads both forms whatever `context.variant` says
("gigachat3", "gigachat3.1"); the variants give the grammar each template's form.
"""

from __future__ import annotations

import re

from ..family import (CONTENT, CUT_OFF, ENDED, CallSyntax, Family, FamilyParse, Open, ParseContext, Segment, Text,
                      held_back, nonempty)
from ._marked_calls import JSON_ENDS, UNREADABLE, JsonBroken, JsonCutOff, json_value_at, named_calls

MESSAGE_SEP, ROLE_SEP, FUNCTION_CALL = "<|message_sep|>", "<|role_sep|>", "<|function_call|>"
CALL_ROLE = "function call"
V3_OPEN = MESSAGE_SEP + "\n\n" + CALL_ROLE + ROLE_SEP + "\n"  # as the 3.0 template writes it

# A call's opening: 3.1's token, or 3.0's message separator and the call's role.
_OPENER = re.compile(re.escape(FUNCTION_CALL) + "|" + re.escape(MESSAGE_SEP) + r"\s*" + CALL_ROLE
                     + r"\s*" + re.escape(ROLE_SEP))
# Content goes on until one of these: 3.1's call token, or a message's end (3.0's call, or the
# output's end).
CONTENT_STOPS = (FUNCTION_CALL, MESSAGE_SEP)
# After a call that is not JSON, the rest of the output is content as written.
RAW = "raw"


def parse(text: str, context: ParseContext) -> FamilyParse:
    # Nothing depends on where the output starts: the output's start reads as content does.
    if context.state == ENDED:
        return FamilyParse((), open=Open(len(text), ENDED, None, ()))
    if context.state == RAW:
        return FamilyParse(nonempty([Text(text)]), open=Open(len(text), RAW, Text, ()))
    segments: list[Segment] = []
    error = None
    position = 0
    while True:
        opener = _OPENER.search(text, position)
        turn_end = text.find(MESSAGE_SEP, position)
        if turn_end >= 0 and (opener is None or turn_end < opener.start()):
            segments.append(Text(text[position:turn_end]))
            if not context.final and _may_open_call(text[turn_end:]):
                # 3.0's call opening may still come: nothing comes of the text from the
                # separator until its <|role_sep|> does (or it turns out the output's end).
                return FamilyParse(nonempty(segments), error, Open(turn_end, CONTENT, None, (ROLE_SEP,)))
            # The message ends, no call after it: the output has ended there.
            return FamilyParse(nonempty(segments), error, Open(len(text), ENDED, None, ()))
        if opener is None:
            # Text that may begin a marker waits.
            at = len(text) if context.final else len(text) - held_back(text[position:], CONTENT_STOPS)
            segments.append(Text(text[position:at]))
            return FamilyParse(nonempty(segments), error, Open(at, CONTENT, Text, CONTENT_STOPS))
        segments.append(Text(text[position:opener.start()]))
        found = json_value_at(text, opener.end())
        if isinstance(found, JsonCutOff):
            if context.final:  # a call cut off by the end of the output: dropped
                return FamilyParse(nonempty(segments), CUT_OFF)
            # Read again from the opener when a bracket may have closed the JSON (text that
            # turns out not to be JSON waits for one too, or for the end).
            return FamilyParse(nonempty(segments), error, Open(opener.start(), CONTENT, None, JSON_ENDS))
        if isinstance(found, JsonBroken):
            # Not JSON: the call's raw text and everything after it are content.
            segments.append(Text(text[opener.start():]))
            return FamilyParse(nonempty(segments), UNREADABLE, Open(len(text), RAW, Text, ()))
        value, end = found
        calls = named_calls(value, "name", ("arguments", "parameters")) if isinstance(value, dict) else None
        if calls is None:
            segments.append(Text(text[opener.start():end]))
            error = UNREADABLE
        else:
            segments += calls
        position = end


def _may_open_call(tail: str) -> bool:
    """Whether text from a <|message_sep|> may still grow into 3.0's call opening."""
    rest = tail[len(MESSAGE_SEP):].lstrip()
    if rest.startswith(CALL_ROLE):
        after = rest[len(CALL_ROLE):].lstrip()
        return ROLE_SEP.startswith(after)
    return CALL_ROLE.startswith(rest)


FAMILY = Family(
    name="gigachat",
    description='GigaChat 3 (<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": ..., "arguments": {...}}) '
                'and 3.1 (<|function_call|>{"name": ..., "arguments": {...}})',
    parse=parse,
    fingerprints=((MESSAGE_SEP, ROLE_SEP, FUNCTION_CALL), (MESSAGE_SEP, ROLE_SEP, "'function call'")),
    markers=(MESSAGE_SEP, ROLE_SEP, FUNCTION_CALL),
    priority=60,
    # First match wins: 3.1's template also names the `function call` role in its prose.
    variants={"gigachat3.1": (FUNCTION_CALL,), "gigachat3": (MESSAGE_SEP, ROLE_SEP)},
    # Calls as each template writes them back into the history.
    call_syntax=CallSyntax(call_open=FUNCTION_CALL + '{"name": "{name}", "arguments": ', call_close="}"),
    variant_call_syntax={
        "gigachat3": CallSyntax(call_open=V3_OPEN + '{"name": "{name}", "arguments": ', call_close="}"),
    },
)
