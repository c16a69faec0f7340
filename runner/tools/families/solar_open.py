"""Upstage Solar Open: messages framed by tokens, calls with an id, a name and JSON arguments.

The generation prompt is `<|begin|>assistant`; the model writes its reasoning, then a new
assistant message holding the answer or the calls:

    <|think|>The user wants the weather.<|end|><|begin|>assistant<|tool_calls|>
    <|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_weather<|tool_call:args|>{"city": "Paris"}<|tool_call:end|>
    <|calls|>

(one string, without the line breaks), or `...<|end|><|begin|>assistant<|content|>It is sunny.<|end|>`.
The id (10 lowercase letters or digits, the model's own) is not kept: the server gives calls
its own ids. With reasoning_effort low or minimal the template writes an empty reasoning message
(`<|begin|>assistant<|think|><|end|>`) before the prompt's `<|begin|>assistant`.
"""

from __future__ import annotations

from ..family import Call, CallSyntax, Family, FamilyParse, ParseContext, PartialCall, leading_reasoning, then, json_object_text
from ._marked_calls import closed_section, content_and_calls

BEGIN, END, ASSISTANT = "<|begin|>", "<|end|>", "assistant"
THINK, CONTENT, TOOL_CALLS, CALLS_END = "<|think|>", "<|content|>", "<|tool_calls|>", "<|calls|>"
CALL_BEGIN, CALL_NAME, CALL_ARGS, CALL_END = "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", \
    "<|tool_call:end|>"
MARKERS = (BEGIN, END, THINK, CONTENT, TOOL_CALLS, CALLS_END, CALL_BEGIN, CALL_NAME, CALL_ARGS, CALL_END)
# The frames of the messages around the answer: dropped from the content.
FRAMES = (BEGIN, END, CONTENT, TOOL_CALLS, CALLS_END)
HEADER = BEGIN + ASSISTANT


def parse(text: str, context: ParseContext) -> FamilyParse:
    # A message that starts the answer or the calls also ends reasoning the model never closed.
    reasoning, body = leading_reasoning(text, context, THINK, (END,), also_ending=(CONTENT, TOOL_CALLS, CALL_BEGIN))
    if body is None:
        return reasoning
    return then(reasoning, body, content_and_calls(text[body:], context, (CALL_BEGIN,), _read_call,
                                                   hidden=(HEADER, *FRAMES)))


def _call(body: str, context: ParseContext) -> tuple[Call, ...] | None:
    """ID<|tool_call:name|>NAME<|tool_call:args|>{...} as a call (None: not one)."""
    _, has_name, named = body.partition(CALL_NAME)
    name, has_arguments, raw = named.partition(CALL_ARGS)
    name = name.strip()
    if not has_name or not has_arguments or not name or "<|" in name:
        return None
    arguments = "{}" if not raw.strip() else json_object_text(raw)
    return None if arguments is None else (Call(name, arguments),)


def _partial(body: str) -> PartialCall | None:
    """The call as far as it is written, once its name is and its arguments' object began (their
    text as json_object_text will give it, less whitespace that may end it)."""
    _, has_name, named = body.partition(CALL_NAME)
    name, has_arguments, raw = named.partition(CALL_ARGS)
    raw = raw.strip()
    return PartialCall(name.strip(), raw) if has_name and has_arguments and name.strip() and raw.startswith("{") else None


_read_call = closed_section(CALL_END, _call, streams=_partial)

FAMILY = Family(
    name="solar-open",
    description="<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{json}"
                "<|tool_call:end|><|calls|> (Upstage Solar Open)",
    parse=parse,
    fingerprints=((CALL_BEGIN, CALL_NAME, CALL_ARGS, BEGIN + ASSISTANT),),
    markers=MARKERS,
    reasoning=(THINK, END),
    priority=30,  # before the generic format
    # Constrained calls as the template writes them back (the id a number the model writes).
    # After its reasoning the model opens a new message; content needs a <|content|> token that
    # free text in a grammar cannot hold, so `auto` is left free.
    call_syntax=CallSyntax(block_open=TOOL_CALLS, call_open=CALL_BEGIN + "{index}" + CALL_NAME + "{name}" + CALL_ARGS,
                           call_close=CALL_END, block_close=CALLS_END,
                           reasoning=(THINK, END + BEGIN + ASSISTANT), constrains_auto=False),
)
