"""Hermes 2 Pro and Qwen 2.5 / Qwen3 (non-Coder): <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
reasoning in <think>...</think> (Qwen3).

    <think>The user wants the weather.</think>
    Let me look.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The closing tag may be missing, or cut short, where the output ends right after a whole call.
Qwen3's templates may open <think> in the prompt: where the model reasons (its template says)
and its output opens no block, the text before the first </think> waits until a </think>, a
call or the end says whether it was reasoning.
"""

from __future__ import annotations

from ..family import Family, FamilyParse, ParseContext, then
from ._json_calls import (THINK_CLOSE, THINK_OPEN, Progress, call_object, json_call_syntax, lead, marked_groups,
                          past_close)

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
UNCLOSED = f"the model's tool call is not closed by {CALL_CLOSE}"


def parse(text: str, context: ParseContext) -> FamilyParse:
    blocks = ((THINK_OPEN, THINK_CLOSE),) if context.reasons else ()
    reasoning, body = lead(text, context, blocks, settles=(CALL_OPEN,))
    if body is None:
        return reasoning
    return then(reasoning, body, _body(text[body:], context))


def _body(text: str, context: ParseContext) -> FamilyParse:
    return marked_groups(text, context, CALL_OPEN, _call_block, (CALL_CLOSE,))


def _call_block(text: str, position: int, final: bool, progress: Progress) -> int:
    """After <tool_call>: one call object, then </tool_call> (or the end of the output)."""
    call, position = call_object(text, position, final)
    position = past_close(text, position, final, CALL_CLOSE, UNCLOSED)
    progress.add(call, position)
    return position


FAMILY = Family(
    name="hermes",
    description='<tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes 2 Pro, Qwen 2.5, Qwen3)',
    parse=parse,
    # The JSON call's own key, quoted as the template writes it: a template that holds
    # <tool_call> but writes another body (XML, say) is left to the other fingerprints or to
    # what it renders.
    fingerprints=(("<tool_call>", '"arguments"'),),
    markers=(CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE),
    reasoning=(THINK_OPEN, THINK_CLOSE),
    priority=80,  # after the families whose templates also write <tool_call> (Qwen3-Coder's XML, GLM)
    legacy_format="hermes",
    call_syntax=json_call_syntax(CALL_OPEN + "\n", "\n" + CALL_CLOSE, separator="\n", trigger=CALL_OPEN),
    keeps_space_before_calls=False,
)
