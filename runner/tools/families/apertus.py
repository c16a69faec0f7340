"""Swiss AI Apertus: the calls as a JSON list of {name: arguments} objects between
<|tools_prefix|> and <|tools_suffix|>, reasoning between <|inner_prefix|> and <|inner_suffix|>:

    <|inner_prefix|>The user wants the weather.<|inner_suffix|><|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>

(llama.cpp's "function name as key" form; a {"name": ..., "arguments": ...} object reads too.)
"""

from __future__ import annotations

import json
from typing import Any

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext, leading_reasoning, then
from ._marked_calls import Keys, arguments_of, closed_section, content_and_calls, named_calls

CALLS, END_CALLS = "<|tools_prefix|>", "<|tools_suffix|>"
INNER, END_INNER = "<|inner_prefix|>", "<|inner_suffix|>"
END_OF_TURN = "<|assistant_end|>"


def _call_of(item: Any) -> Call | None:
    """{name: {arguments}}: one key, the function's name; or the usual {"name", "arguments"}."""
    if isinstance(item, dict) and len(item) == 1:
        name, value = next(iter(item.items()))
        arguments = arguments_of(value)
        return Call(name, arguments) if name and arguments is not None else None
    calls = named_calls(item, "name", ("arguments",))
    return calls[0] if calls else None


def _list_calls(body: str, context: ParseContext) -> tuple[Call, ...] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    calls = [_call_of(item) for item in (value if isinstance(value, list) else [value])]
    return tuple(calls) if calls and None not in calls else None


_read_calls = closed_section(END_CALLS, _list_calls, streams=Keys(("name",), ("arguments",), name_is_key=True))


def parse(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = leading_reasoning(text, context, INNER, (END_INNER,), also_ending=(CALLS,))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALLS,), _read_calls, hidden=(END_OF_TURN,)))


FAMILY = Family(
    name="apertus",
    description='<|tools_prefix|>[{"name": {...arguments}}]<|tools_suffix|> (Apertus), <|inner_prefix|> reasoning',
    parse=parse,
    fingerprints=((CALLS, END_CALLS),),
    markers=(CALLS, END_CALLS, INNER, END_INNER, END_OF_TURN),
    reasoning=(INNER, END_INNER),
    priority=60,
    call_syntax=CallSyntax(block_open=CALLS + "[", call_open='{"{name}": ', call_close="}", separator=", ",
                           block_close="]" + END_CALLS),
)
