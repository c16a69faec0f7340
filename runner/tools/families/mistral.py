"""Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}] (v3: Mistral 7B v0.3, Nemo) and
[TOOL_CALLS]name[ARGS]{...} (v11 and later: Mistral Small 3.2, Devstral, Magistral, Ministral 3),
with [CALL_ID]id before [ARGS] where the model writes its call's id (Mistral Small 3.2):

    Checking.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Reasoning (Magistral, Ministral 3 Reasoning) in [THINK]...[/THINK] at the start of the output,
control tokens; Magistral Small 2506 wrote <think>...</think> as text. Mistral's templates never
open the block in the prompt: text the output starts with is content.
"""

from __future__ import annotations

from typing import Any

from ..family import Call, Family, FamilyParse, ParseContext, PartialCall, then
from ._json_calls import (JSON_CLOSERS, NO_NAME, THINK_CLOSE, THINK_OPEN, Malformed, Pending, Progress, arguments_at,
                          call_array, json_call_syntax, lead, marked_groups, next_char, skip_json_space)

CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
THINK, END_THINK = "[THINK]", "[/THINK]"
NO_ARGS = f"the model's tool call has no {ARGS} after the function name"
NAME_PUNCTUATION = "_-."


def parse(text: str, context: ParseContext) -> FamilyParse:
    # [THINK] is a control token (Magistral, Ministral 3 Reasoning): never text, always reasoning.
    blocks = ((THINK, END_THINK), *(((THINK_OPEN, THINK_CLOSE),) if context.reasons else ()))
    reasoning, body = lead(text, context, blocks, settles=(), prompt_may_open=False)
    if body is None:
        return reasoning
    return then(reasoning, body, _body(text[body:], context))


def _body(text: str, context: ParseContext) -> FamilyParse:
    return marked_groups(text, context, CALLS, _calls, JSON_CLOSERS)


def _calls(text: str, position: int, final: bool, progress: Progress) -> int:
    """After [TOOL_CALLS]: a JSON array of call objects, or `name[CALL_ID]id[ARGS]{...}`."""
    position = skip_json_space(text, position)
    if next_char(text, position) == "[":
        return call_array(text, position, final, progress)
    name, position = _word(text, position, NAME_PUNCTUATION)
    if text.startswith(CALL_ID, position):
        _, position = _word(text, position + len(CALL_ID), "")  # the call's id: ours are the server's
    elif not final and CALL_ID.startswith(text[position:]):
        raise Pending
    if not text.startswith(ARGS, position):
        if ARGS.startswith(text[position:]):
            raise Pending  # (at the end of the output: cut off)
        raise Malformed(NO_ARGS)
    if not name:
        raise Malformed(NO_NAME)
    start = skip_json_space(text, position + len(ARGS))
    try:
        arguments, position = arguments_at(text, start, final)
    except Pending:  # the arguments as they are written (an object's text as it will read): they stream
        raise Pending(PartialCall(name, text[start:]) if text.startswith("{", start) else None, in_call=True) from None
    progress.add(Call(name, arguments), position)
    return position


def _word(text: str, position: int, punctuation: str) -> tuple[str, int]:
    """Letters, digits and `punctuation` from `position`, and where they end; Pending where the
    text ends in them."""
    start = position
    while position < len(text) and (text[position].isalnum() or text[position] in punctuation):
        position += 1
    if position == len(text):
        raise Pending
    return text[start:position], position


def template_messages(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Ministral 3's and Magistral's templates read a system or assistant turn as blocks: its
    reasoning as a `thinking` block, then its text (llama.cpp's Ministral 3 handler; Mistral
    Small 3.2, whose template writes call ids, reads text)."""
    if not all(part in source for part in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) or "[CALL_ID]" in source:
        return messages
    return [_as_blocks(message) if message["role"] in ("system", "assistant") else message for message in messages]


def _as_blocks(message: dict[str, Any]) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if isinstance(message.get("reasoning_content"), str):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
    content = message.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend(content)
    shaped = message | {"content": blocks}
    shaped.pop("reasoning_content", None)
    return shaped


FAMILY = Family(
    name="mistral",
    description='[TOOL_CALLS][{"name": ..., "arguments": {...}}] or [TOOL_CALLS]name[ARGS]{...} (Mistral, Devstral)',
    parse=parse,
    fingerprints=(("[TOOL_CALLS]",),),
    markers=(CALLS, ARGS, CALL_ID, THINK, END_THINK),
    reasoning=(THINK, END_THINK),
    priority=85,
    legacy_format="mistral",
    call_syntax=json_call_syntax(block_open=CALLS + "[", block_close="]", separator=", ", trigger=CALLS),
    keeps_space_before_calls=False,
    call_id_length=9,  # Mistral's templates refuse any other id ("alphanumeric strings with length 9")
    template_messages=template_messages,
)
