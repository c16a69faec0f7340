"""Fireworks FireFunction v2 (on Llama 3): the calls as a JSON list after "functools", with no
closing marker (the JSON value ends them):

    Let me check. functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]
"""

from __future__ import annotations

from typing import Any

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext
from ._marked_calls import Keys, content_and_calls, json_section, named_calls

CALLS = "functools["  # the "[" begins the JSON list: a bare "functools" (Python's module) is text
END_OF_TURN = "<|eot_id|>"


def _calls_of(value: Any, context: ParseContext) -> tuple[Call, ...] | None:
    return named_calls(value, "name", ("arguments",)) if isinstance(value, list) else None


_read_calls = json_section(_calls_of, opener_keeps=1, streams=Keys(("name",), ("arguments",)))


def parse(text: str, context: ParseContext) -> FamilyParse:
    return content_and_calls(text, context, (CALLS,), _read_calls, hidden=(END_OF_TURN,))


FAMILY = Family(
    name="firefunction-v2",
    description='functools[{"name": ..., "arguments": {...}}] (FireFunction v2)',
    parse=parse,
    fingerprints=((" functools[",),),
    markers=(CALLS, END_OF_TURN),
    priority=60,  # its template is a Llama 3 one
    # The template writes the list after the content and a space (" functools[" where there is
    # no content).
    call_syntax=CallSyntax(block_open=" " + CALLS, call_open='{"name": "{name}", "arguments": ', call_close="}",
                           separator=", ", block_close="]"),
)
