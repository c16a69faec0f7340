"""ServiceNow Apriel 1.5 and 1.6: the calls as a JSON list between <tool_calls> and
</tool_calls>; the reasoning before "[BEGIN FINAL RESPONSE]" (1.6, whose generation prompt
opens it with "Here are my reasoning steps:") or in <thinking>...</thinking> (1.5):

    The user wants the weather.
    [BEGIN FINAL RESPONSE]
    <tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>

The templates also mention Hermes' <tool_call> in their instructions: this family comes
before hermes in detection.
"""

from __future__ import annotations


from ..family import CallSyntax, Family, FamilyParse, ParseContext, leading_reasoning, then
from ._marked_calls import Keys, closed_section, content_and_calls, json_list_calls

CALLS, END_CALLS = "<tool_calls>", "</tool_calls>"
REASONING_STEPS = "Here are my reasoning steps:"  # what Apriel 1.6's generation prompt ends with
FINAL_RESPONSE, END_FINAL_RESPONSE = "[BEGIN FINAL RESPONSE]", "[END FINAL RESPONSE]"
THINKING, END_THINKING = "<thinking>", "</thinking>"
END_OF_TURN = "<|end|>"


_read_calls = closed_section(END_CALLS, json_list_calls, streams=Keys(("name",), ("arguments",)))


def parse(text: str, context: ParseContext) -> FamilyParse:
    if context.reasoning_open:
        reasoning, body = leading_reasoning(text, context, REASONING_STEPS, (FINAL_RESPONSE,), also_ending=(CALLS,))
    else:
        reasoning, body = leading_reasoning(text, context, THINKING, (END_THINKING,), also_ending=(CALLS,))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALLS,), _read_calls, hidden=(FINAL_RESPONSE, END_FINAL_RESPONSE, END_OF_TURN)))


FAMILY = Family(
    name="apriel",
    description='<tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls> (ServiceNow Apriel 1.5, 1.6)',
    parse=parse,
    fingerprints=(("<tool_calls>[", FINAL_RESPONSE),),
    markers=(CALLS, END_CALLS, FINAL_RESPONSE, END_FINAL_RESPONSE, THINKING, END_THINKING, END_OF_TURN),
    reasoning=(REASONING_STEPS, FINAL_RESPONSE),
    priority=60,  # before hermes (80): the templates' instructions also name <tool_call>
    # As the templates write the last turn's calls (earlier turns get the server's call id
    # after the arguments, which the model never writes).
    call_syntax=CallSyntax(block_open=CALLS + "[", call_open='{"name": "{name}", "arguments": ', call_close="}",
                           separator=", ", block_close="]" + END_CALLS),
)
