"""Gemma 4: calls in Gemma's object notation between <|tool_call> and <tool_call|>, reasoning in
the thought channel.

    <|channel>thought
    The user wants the weather.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

A call is `call:NAME{...}`: keys bare (they may hold spaces), strings between <|"|> markers (which
may hold any text, markers included), numbers, true, false and null bare, objects and arrays
nested. Several calls follow one another; text may come before and after them. The template's
generation prompt ends with an empty thought channel (`<|channel>thought\\n<channel|>`) when
thinking is off; with thinking on the model opens the channel itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..family import (CONTENT, CUT_OFF, REASONING, STRICT_JSON, Call, CallSyntax, Family, FamilyParse, Open,
                      ParseContext, PartialCall, Segment, Text, Thought, arguments_json, held_back, reread_pace, skip_space,
                      string_value_partial)

CALL_OPEN = "<|tool_call>"
CALL_CLOSE = "<tool_call|>"
QUOTE = '<|"|>'  # opens and closes a string
CHANNEL_OPEN = "<|channel>"
CHANNEL_CLOSE = "<channel|>"
THOUGHT = "thought"  # the channel's name, written after its opener
# Markers that may interrupt content: a call, a thought channel, and a stray end of a channel
# (dropped: llama.cpp's tests have the model write one after an empty thought).
CONTENT_MARKERS = (CALL_OPEN, CHANNEL_OPEN, CHANNEL_CLOSE)
THOUGHT_MARKERS = (CHANNEL_CLOSE,)  # what ends the thought channel (nothing else is read in it)
# A call has ended only at its closer (a whole call the output ends after is read at the end).
CALL_MARKERS = (CALL_CLOSE,)

UNREADABLE = "the model's tool call is not in Gemma's call:NAME{...} notation"
CALL_HEAD = re.compile(r"\s*call:([\w.\-]+)(?=\s*\{)")
OBJECT_KEY_ENDS = ":{}[],<"  # a bare key never holds these


class _NotNotation(ValueError):
    """The text is not a call in the notation."""


def parse(text: str, context: ParseContext) -> FamilyParse:
    """Content with thought channels and calls in it. The state says where the text starts: the
    output's start (None: where the prompt may have opened the thought channel), inside a
    thought channel (REASONING), or in content (CONTENT); a parse of a growing output goes on
    from the end of the settled text, or from the marker of what has not ended."""
    segments: list[Segment] = []
    error: str | None = None
    position: int | None = 0
    opened: Open | None = None
    if context.state == REASONING:
        position, opened = _read_thought(text, 0, context, segments)
    elif context.state is None and context.reasoning_open:
        # The prompt wrote `<|channel>thought\n`: the output starts as reasoning.
        start = _after_channel_name(text, 0, context, named=False)
        if start is None:
            return FamilyParse((), open=Open(0))  # the model may write the opener again itself: wait
        position, opened = _read_thought(text, start, context, segments)
    while position is not None:
        marker_at, marker = _first_marker(text, position)
        if marker is None:
            at = len(text) if context.final else len(text) - held_back(text[position:], CONTENT_MARKERS)
            _add_text(segments, text[position:at])
            return FamilyParse(tuple(segments), error, Open(at, CONTENT, Text, CONTENT_MARKERS))
        _add_text(segments, text[position:marker_at])
        if marker == CHANNEL_CLOSE:
            position = marker_at + len(marker)
            continue
        if marker == CHANNEL_OPEN:
            start = _after_channel_name(text, marker_at + len(marker), context, named=True)
            if start is None:  # the channel's name not yet whole: read again from its opener
                return FamilyParse(tuple(segments), error, Open(marker_at, CONTENT))
            position, opened = _read_thought(text, start, context, segments)
        else:
            position, problem, opened = _read_call(text, marker_at, context, segments)
            error = problem or error  # the last one (a stream keeps the last error a parse gave)
    return FamilyParse(tuple(segments), error, opened)


def _first_marker(text: str, start: int) -> tuple[int, str | None]:
    found = [(at, marker) for marker in CONTENT_MARKERS if (at := text.find(marker, start)) >= 0]
    return min(found) if found else (-1, None)


def _add_text(segments: list[Segment], text: str) -> None:
    if text:
        segments.append(Text(text))


# --- reasoning -----------------------------------------------------------------------------------

def _read_thought(text: str, start: int, context: ParseContext,
                  segments: list[Segment]) -> tuple[int | None, Open | None]:
    """The thought channel from `start` (past its opener and name) to <channel|>: (where the
    text after it starts, None; or None and where the reading goes on from, while it has not
    ended)."""
    end = text.find(CHANNEL_CLOSE, start)
    if end < 0:
        at = len(text) if context.final else len(text) - held_back(text[start:], THOUGHT_MARKERS)
        segments.append(Thought(text[start:at]))
        return None, Open(at, REASONING, Thought, THOUGHT_MARKERS)
    segments.append(Thought(text[start:end]))
    return end + len(CHANNEL_CLOSE), None


def _after_channel_name(text: str, start: int, context: ParseContext, named: bool) -> int | None:
    """Past the channel's name (`thought`) and any repeated opener (llama.cpp's tests have the
    model write `<|channel><|channel>thought`); None while the text may still be one of them."""
    while True:
        rest = text[start:]
        if rest.startswith(CHANNEL_OPEN):
            start += len(CHANNEL_OPEN)
            named = True
        elif named and rest.startswith(THOUGHT):
            return start + len(THOUGHT)
        elif not context.final and (CHANNEL_OPEN.startswith(rest) or (named and THOUGHT.startswith(rest))):
            return None
        else:
            return start


# --- calls ---------------------------------------------------------------------------------------

def _read_call(text: str, start: int, context: ParseContext,
               segments: list[Segment]) -> tuple[int | None, str | None, Open | None]:
    """The call whose <|tool_call> is at `start`: (where the text after it starts, or None
    where the reading stops: the output ended, or the call has not; the error when it is given
    back as content or dropped; while it has not ended, the reading goes on from its opener)."""
    body_start = start + len(CALL_OPEN)
    end = _call_end(text, body_start)
    if end >= 0:
        try:
            segments.append(_call(text[body_start:end]))
        except _NotNotation:
            segments.append(Text(text[start:end + len(CALL_CLOSE)]))  # the raw text, as the model wrote it
            return end + len(CALL_CLOSE), UNREADABLE, None
        return end + len(CALL_CLOSE), None, None
    if not context.final:  # the call goes on: it waits (a string value streams: read again at a pace too)
        partial = _partial(text[body_start:])
        if partial is not None:
            segments.append(partial)
        return None, None, Open(start, CONTENT, None, CALL_MARKERS, reread_after=reread_pace(partial))
    try:  # the output ended after a whole call whose <tool_call|> it never wrote
        segments.append(_call(text[body_start:]))
        return None, None, None
    except _NotNotation:
        pass
    # Cut off: a call all the same (the model was writing one), dropped, its markers and all.
    return None, CUT_OFF, None


def _call_end(text: str, start: int) -> int:
    """Where the call's <tool_call|> is (not inside a string), or -1 when the text has none yet."""
    position = start
    while True:
        close = text.find(CALL_CLOSE, position)
        quote = text.find(QUOTE, position)
        if quote < 0 or 0 <= close < quote:
            return close
        string_end = text.find(QUOTE, quote + len(QUOTE))
        if string_end < 0:
            return -1
        position = string_end + len(QUOTE)


def _partial(body: str) -> PartialCall | None:
    """The call being written, as far as it settled, while one of its top-level string values
    is written: the members before it, then its text so far (less what may begin its closing
    quote); None otherwise."""
    head = CALL_HEAD.match(body)
    position = skip_space(body, head.end()) if head else -1
    if not body.startswith("{", position):
        return None
    members: dict[str, Any] = {}
    position += 1
    while True:
        try:
            key, position = _key(body, skip_space(body, position))
        except _NotNotation:
            return None
        position = skip_space(body, position)
        if body.startswith(QUOTE, position) and body.find(QUOTE, position + len(QUOTE)) < 0:
            raw = body[position + len(QUOTE):]
            return string_value_partial(head.group(1), members, key, raw[:len(raw) - held_back(raw, (QUOTE,))])
        try:
            members[key], position = _value(body, position)
        except _NotNotation:
            return None
        position = skip_space(body, position)
        if not body.startswith(",", position):
            return None
        position += 1


def _call(body: str) -> Call:
    """`call:NAME{...}` (the text between the call's markers) as a Call."""
    head = CALL_HEAD.match(body)
    if head is None:
        raise _NotNotation(body)
    arguments, end = _value(body, head.end())
    if not isinstance(arguments, dict) or body[end:].strip():
        raise _NotNotation(body)
    return Call(head.group(1), arguments_json(arguments))


# --- the object notation -------------------------------------------------------------------------

def _value(text: str, start: int) -> tuple[Any, int]:
    """The value at `start` (after whitespace) and where it ends."""
    start = skip_space(text, start)
    if text.startswith(QUOTE, start):
        return _string(text, start)
    if text.startswith("{", start):
        return _object(text, start + 1)
    if text.startswith("[", start):
        return _array(text, start + 1)
    return _scalar(text, start)


def _string(text: str, start: int) -> tuple[str, int]:
    end = text.find(QUOTE, start + len(QUOTE))
    if end < 0:
        raise _NotNotation(text[start:])
    return text[start + len(QUOTE):end], end + len(QUOTE)


def _object(text: str, start: int) -> tuple[dict[str, Any], int]:
    """The members after `{` up to its `}`."""
    members: dict[str, Any] = {}
    position = skip_space(text, start)
    if text.startswith("}", position):
        return members, position + 1
    while True:
        key, position = _key(text, position)
        members[key], position = _value(text, position)
        position = skip_space(text, position)
        if text.startswith("}", position):
            return members, position + 1
        if not text.startswith(",", position):
            raise _NotNotation(text[position:])
        position = skip_space(text, position + 1)


def _key(text: str, start: int) -> tuple[str, int]:
    """A key and its `:`: bare text (spaces allowed), or a string."""
    if text.startswith(QUOTE, start):
        key, position = _string(text, start)
        position = skip_space(text, position)
    else:
        position = start
        while position < len(text) and text[position] not in OBJECT_KEY_ENDS:
            position += 1
        key = text[start:position].strip()
    if not key or not text.startswith(":", position):
        raise _NotNotation(text[start:])
    return key, position + 1


def _array(text: str, start: int) -> tuple[list[Any], int]:
    """The items after `[` up to its `]`."""
    items: list[Any] = []
    position = skip_space(text, start)
    if text.startswith("]", position):
        return items, position + 1
    while True:
        item, position = _value(text, position)
        items.append(item)
        position = skip_space(text, position)
        if text.startswith("]", position):
            return items, position + 1
        if not text.startswith(",", position):
            raise _NotNotation(text[position:])
        position += 1


def _scalar(text: str, start: int) -> tuple[Any, int]:
    """A bare number, true, false or null (up to the `,`, `}` or `]` after it)."""
    end = start
    while end < len(text) and text[end] not in ",}]":
        end += 1
    raw = text[start:end].strip()
    try:
        value = STRICT_JSON.decode(raw)
    except ValueError:
        raise _NotNotation(raw) from None
    if isinstance(value, (dict, list, str)):
        raise _NotNotation(raw)
    return value, end


def template_messages(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Gemma 4's first templates read a turn of calls, their results and the answer after them
    as one model turn holding `tool_responses` (llama.cpp's Gemma 4 handler; the published
    template reads role:tool messages itself)."""
    if "{#- OpenAI Chat Completions:" in source:
        return messages
    shaped, index = [], 0
    while index < len(messages):
        message = messages[index]
        if message["role"] != "assistant" or not message.get("tool_calls"):
            shaped.append(message)
            index += 1
            continue
        turn, index = _model_turn(messages, index)
        shaped.append(turn)
    return shaped


def _model_turn(messages: list[dict[str, Any]], index: int) -> tuple[dict[str, Any], int]:
    """The turn of calls at `index` with the results after it and the answer after them, and
    where the messages go on."""
    calls = list(messages[index]["tool_calls"])
    reasoning = messages[index].get("reasoning_content")
    index += 1
    responses = []
    while index < len(messages) and messages[index]["role"] == "tool":
        result = messages[index]
        name = calls[len(responses)]["function"].get("name", "") if len(responses) < len(calls) else ""
        responses.append({"name": name or result.get("tool_call_id", ""), "response": _response(result.get("content"))})
        index += 1
    turn: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
    if responses:
        turn["tool_responses"] = responses
    if index < len(messages) and messages[index]["role"] == "assistant" and not messages[index].get("tool_calls") \
            and messages[index].get("content"):
        turn["content"] = messages[index]["content"]
        index += 1
    if isinstance(reasoning, str):
        turn["reasoning_content"] = reasoning
    return turn, index


def _response(content: Any) -> Any:
    """A result as the template writes it: JSON where its text is JSON."""
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


def finish_prompt(prompt: str) -> str:
    """A prompt whose last turn is closed (content and calls in one turn) opens the model's next
    one, as llama.cpp's Gemma 4 handler does: the model then starts with its reasoning channel."""
    return prompt + "<|turn>model\n" if prompt.endswith("<turn|>\n") else prompt


FAMILY = Family(
    name="gemma4",
    description="<|tool_call>call:NAME{key:<|\"|>text<|\"|>,n:1}<tool_call|>, "
                "reasoning in <|channel>thought...<channel|> (Gemma 4)",
    parse=parse,
    fingerprints=((CALL_OPEN, CALL_CLOSE),),
    markers=(CALL_OPEN, CALL_CLOSE, QUOTE, CHANNEL_OPEN, CHANNEL_CLOSE, "<|tool_response>", "<tool_response|>",
             "<|turn>", "<turn|>", "<|think|>"),
    # The opener with the channel's name: a prompt that ends with it opened the channel for the model.
    reasoning=(CHANNEL_OPEN + THOUGHT, CHANNEL_CLOSE),
    priority=40,
    # Constrained calls as the template writes them back: keys in the order of their names, bare
    # (between <|"|> where a bare key cannot hold them), strings between <|"|>, nested objects and
    # arrays in the same notation (the reader takes no JSON string inside). `auto` is free text
    # until <|tool_call>, a control token free text never holds.
    call_syntax=CallSyntax(call_open=CALL_OPEN + "call:{name}{", call_close="}" + CALL_CLOSE, parameter_open="{key}:",
                           parameter_separator=",", string_quote=QUOTE, sorts_keys=True, name_pattern=r"[\w.\-]+"),
    template_messages=template_messages,
    finish_prompt=finish_prompt,
)
