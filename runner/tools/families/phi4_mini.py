"""Phi-4-mini: a list of calls (or one call) between <|tool_call|> and <|/tool_call|>.

    Let me check.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>

Its template reads the tools from the system message's `tools` (a JSON text of the functions,
between <|tool|> and <|/tool|>), not from the template's `tools`: the family puts them there
(`tools_in_system`), as Microsoft's examples do. The closing marker may be missing, or cut
short, where the output ends right after the calls; it never reaches the content. The model
does not reason.
"""

from __future__ import annotations

from ..family import Family, FamilyParse, ParseContext
from ._json_calls import (JSON_CLOSERS, Progress, call_array, call_object, json_call_syntax, marked_groups, next_char,
                          past_close, skip_json_space)

CALL_OPEN, CALL_CLOSE = "<|tool_call|>", "<|/tool_call|>"
UNCLOSED = f"the model's tool call is not closed by {CALL_CLOSE}"


def parse(text: str, context: ParseContext) -> FamilyParse:
    return marked_groups(text, context, CALL_OPEN, _calls, (*JSON_CLOSERS, CALL_CLOSE))


def _calls(text: str, position: int, final: bool, progress: Progress) -> int:
    """After <|tool_call|>: a JSON list of call objects (or one object), then <|/tool_call|> (or
    the end of the output)."""
    position = skip_json_space(text, position)
    if next_char(text, position) == "[":
        position = progress.after_last = call_array(text, position, final, progress)  # text after it: its own
        calls = []
    else:
        call, position = call_object(text, position, final)
        calls = [call]
    position = past_close(text, position, final, CALL_CLOSE, UNCLOSED)
    for call in calls:
        progress.add(call, position)
    return position


FAMILY = Family(
    name="phi4-mini",
    description='<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|> (Phi-4-mini)',
    parse=parse,
    fingerprints=(("'<|tool|>' + message['tools'] + '<|/tool|>'", "<|assistant|>"),),
    markers=(CALL_OPEN, CALL_CLOSE),
    call_syntax=json_call_syntax(block_open=CALL_OPEN + "[", block_close="]" + CALL_CLOSE, separator=", ",
                                 trigger=CALL_OPEN),
    keeps_space_before_calls=False,
    tools_in_system=True,
)
