"""MiniMax-M1 (and MiniMax-Text-01's template): the calls as JSON objects, one a line, between
<tool_calls> and </tool_calls>; reasoning in <think>...</think> at the start:

    <think>
    The user wants the weather.
    </think>
    Let me look.
    <tool_calls>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    {"name": "get_time", "arguments": {"city": "Paris"}}
    </tool_calls>

The template writes the arguments with `tojson`, so a call whose arguments the client gave as a
string comes back as a JSON string holding the object: both are read. <end_of_sentence> ends
the turn (the model's stop token); a model that goes on with another turn is not read further.
llama.cpp has no parser of its own for this template (its autoparser reads it).
"""

from __future__ import annotations

import json

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext, leading_reasoning, then, read_turn
from ._marked_calls import Keys, closed_section, content_and_calls, named_calls, skip_space

CALLS, END_CALLS = "<tool_calls>", "</tool_calls>"
THINK, END_THINK = "<think>", "</think>"
END_OF_TURN = "<end_of_sentence>"
START_OF_TURN = "<beginning_of_sentence>"

_DECODER = json.JSONDecoder()


def _calls_in_block(body: str, context: ParseContext) -> tuple[Call, ...] | None:
    """The JSON values in the block, one after the other (the template writes one object a
    line; a model that writes one list of them is read too); None when they are not calls."""
    calls: list[Call] = []
    position = skip_space(body, 0)
    while position < len(body):
        try:
            value, position = _DECODER.raw_decode(body, position)
        except ValueError:
            return None
        read = named_calls(value, "name", ("arguments", "parameters"))
        if read is None:
            return None
        calls += read
        position = skip_space(body, position)
    return tuple(calls) if calls else None


_read_block = closed_section(END_CALLS, _calls_in_block, streams=Keys(("name",), ("arguments", "parameters")))


def parse(text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, (END_OF_TURN,), _parse_turn)


def _parse_turn(text: str, context: ParseContext) -> FamilyParse:
    # A block of calls also ends thinking the model did not close.
    reasoning, body = leading_reasoning(text, context, THINK, (END_THINK,), also_ending=(CALLS,))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALLS,), _read_block,
                                                       hidden=(END_OF_TURN, START_OF_TURN)))


FAMILY = Family(
    name="minimax-m1",
    description='<tool_calls>\\n{"name": ..., "arguments": {...}}\\n...\\n</tool_calls> (MiniMax-M1, MiniMax-Text-01), '
                "reasoning in <think>",
    parse=parse,
    # Apriel's <tool_calls> holds a list ("<tool_calls>["), and its template no <beginning_of_sentence>.
    fingerprints=((CALLS, END_CALLS, START_OF_TURN),),
    markers=(CALLS, END_CALLS, THINK, END_THINK, END_OF_TURN, START_OF_TURN),
    reasoning=(THINK, END_THINK),
    priority=60,
    # Calls as the template writes them back into the history.
    call_syntax=CallSyntax(block_open=CALLS + "\n", call_open='{"name": "{name}", "arguments": ', call_close="}",
                           separator="\n", block_close="\n" + END_CALLS),
)
