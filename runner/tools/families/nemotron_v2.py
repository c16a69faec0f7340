"""NVIDIA Nemotron Nano v2: the calls as a JSON list between <TOOLCALL> and </TOOLCALL>,
reasoning in <think>...</think> (its generation prompt opens the block when thinking is on):

    I need the weather.
    </think>
    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>
"""

from __future__ import annotations


from ..family import CallSyntax, Family, FamilyParse, ParseContext, leading_reasoning, then
from ._marked_calls import Keys, closed_section, content_and_calls, json_list_calls

CALLS, END_CALLS = "<TOOLCALL>", "</TOOLCALL>"
THINK, END_THINK = "<think>", "</think>"
END_OF_TURN = "<SPECIAL_12>"


_read_calls = closed_section(END_CALLS, json_list_calls, streams=Keys(("name",), ("arguments",)))


def parse(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = leading_reasoning(text, context, THINK, (END_THINK,), also_ending=(CALLS,))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALLS,), _read_calls, hidden=(END_OF_TURN,)))


FAMILY = Family(
    name="nemotron-v2",
    description='<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL> (Nemotron Nano v2), <think>',
    parse=parse,
    fingerprints=((CALLS, END_CALLS),),
    markers=(CALLS, END_CALLS, THINK, END_THINK, END_OF_TURN),
    reasoning=(THINK, END_THINK),
    priority=60,
    call_syntax=CallSyntax(block_open=CALLS + "[", call_open='{"name": "{name}", "arguments": ', call_close="}",
                           separator=", ", block_close="]" + END_CALLS),
)
