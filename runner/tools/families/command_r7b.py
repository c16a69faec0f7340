"""Cohere Command R7B and Cohere2 MoE (North Code): every part of the answer between markers.

    <|START_THINKING|>I will look up the weather.<|END_THINKING|><|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}
    ]<|END_ACTION|>

or, for text, <|START_RESPONSE|>...<|END_RESPONSE|> (R7B) / <|START_TEXT|>...<|END_TEXT|>
(Cohere2 MoE). Cohere2 MoE's generation prompt opens the thinking block for the model, and a
model may go straight to its action or its text without closing it: those markers end it too.
The tool_call_id is the model's numbering of its calls; the server gives calls its own ids.
"""

from __future__ import annotations

import json

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext, leading_reasoning, then
from ._marked_calls import Keys, closed_section, content_and_calls, named_calls

THINKING, END_THINKING = "<|START_THINKING|>", "<|END_THINKING|>"
ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"
RESPONSE, END_RESPONSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"
TEXT, END_TEXT = "<|START_TEXT|>", "<|END_TEXT|>"  # Cohere2 MoE's response markers
TURN_MARKERS = ("<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")


def _action_calls(body: str, context: ParseContext) -> tuple[Call, ...] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return named_calls(value, "tool_name", ("parameters", "arguments"))


_read_action = closed_section(END_ACTION, _action_calls, streams=Keys(("tool_name",), ("parameters", "arguments")))


def parse(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = leading_reasoning(text, context, THINKING, (END_THINKING,), also_ending=(ACTION, RESPONSE, TEXT))
    if body is None:
        return reasoning
    # The response markers wrap the content; the turn's tokens, where they show, are not text.
    return then(reasoning, body, content_and_calls(text[body:], context, (ACTION,), _read_action,
                                                       hidden=(RESPONSE, END_RESPONSE, TEXT, END_TEXT, *TURN_MARKERS)))


FAMILY = Family(
    name="command-r7b",
    description='<|START_ACTION|>[{"tool_call_id": ..., "tool_name": ..., "parameters": {...}}]<|END_ACTION|> '
                '(Cohere Command R7B, Cohere2 MoE), <|START_THINKING|>...<|END_THINKING|>',
    parse=parse,
    fingerprints=((ACTION, END_ACTION),),
    markers=(THINKING, END_THINKING, ACTION, END_ACTION, RESPONSE, END_RESPONSE, TEXT, END_TEXT, *TURN_MARKERS),
    reasoning=(THINKING, END_THINKING),
    priority=60,
    # As the templates write a turn's calls back: one per line, numbered by tool_call_id.
    call_syntax=CallSyntax(block_open=ACTION + "[\n    ",
                           call_open='{"tool_call_id": "{index}", "tool_name": "{name}", "parameters": ',
                           call_close="}", separator=",\n    ", block_close="\n]" + END_ACTION),
)
