"""IBM Granite 3.x: the calls as a JSON list after <|tool_call|>, reasoning in <think>...</think>
and the answer (when the model reasons) in <response>...</response>:

    <think>The user wants the weather.</think><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

The list has no closing marker: the JSON value ends the calls. Granite 4.0 and 4.1 write
Hermes' <tool_call>{...}</tool_call> instead, and stay with the hermes family.
"""

from __future__ import annotations

from typing import Any

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext, leading_reasoning, then
from ._marked_calls import Keys, content_and_calls, json_section, named_calls

CALLS = "<|tool_call|>"
THINK, END_THINK = "<think>", "</think>"
RESPONSE, END_RESPONSE = "<response>", "</response>"
END_OF_TEXT = "<|end_of_text|>"


def _calls_of(value: Any, context: ParseContext) -> tuple[Call, ...] | None:
    return named_calls(value, "name", ("arguments", "parameters"))


_read_calls = json_section(_calls_of, streams=Keys(("name",), ("arguments", "parameters")))


def parse(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = leading_reasoning(text, context, THINK, (END_THINK,), also_ending=(CALLS,))
    if body is None:
        return reasoning
    # The answer's <response> markers wrap content: dropped, as the end-of-text token.
    return then(reasoning, body, content_and_calls(text[body:], context, (CALLS,), _read_calls,
                                                       hidden=(RESPONSE, END_RESPONSE, END_OF_TEXT)))


FAMILY = Family(
    name="granite",
    description='<|tool_call|>[{"name": ..., "arguments": {...}}] (IBM Granite 3.x), <think>/<response>',
    parse=parse,
    fingerprints=(("<|tool_call|>", "<|start_of_role|>"),),
    markers=(CALLS, THINK, END_THINK, RESPONSE, END_RESPONSE, END_OF_TEXT),
    reasoning=(THINK, END_THINK),
    priority=60,
    # The template writes no calls back into the history (only the content): this is the form
    # its system prompt asks for, "<|tool_call|> followed by a JSON list".
    call_syntax=CallSyntax(block_open=CALLS + "[", call_open='{"name": "{name}", "arguments": ', call_close="}",
                           separator=", ", block_close="]"),
)
