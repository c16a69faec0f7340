"""OpenAI gpt-oss: the Harmony response format, a sequence of messages on channels.

Every message is a header, `<|message|>`, a body and an end marker. The generation prompt is
`<|start|>assistant`, so the output begins inside the first message's header:

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(one string, without the line breaks). The channel says what a message is: `analysis` is
reasoning, `final` is the answer, `commentary` without a recipient is a preamble the user sees
(content). A recipient `to=functions.NAME` makes the message a call of NAME whose body is the
JSON object of its arguments, on any channel; the recipient may be in the role part of the
header (before `<|channel|>`) or after the channel name; a content type (` json` or
`<|constrain|>json`) may follow. Bodies end with `<|end|>`; the answer with `<|return|>` and a
call with `<|call|>` (both stop tokens, so an output usually just ends there). A recipient that
is not a function (`python`, `browser.search`: Harmony's built-in tools) is a call the server
was not asked for: it is dropped, as llama.cpp does.

Marker strings inside a call's JSON strings are text (the model's tokenizer writes them as plain
tokens there), so a call's body is read as JSON first and ends where its object closes.

The output is read part by part, a header and then the body it opens. As it streams, a parse
goes on from the part not yet ended, whose kind is the state: a body of text grows until its
end marker comes; a header, a call's body or a built-in call's body is read again from its
start when something that may end it comes.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from ..family import (CONTENT, CUT_OFF, REASONING, Call, CallSyntax, Family, FamilyParse, Open, ParseContext,
                      PartialCall, Segment, Text, Thought, held_back, json_object_text, reread_pace, skip_space)

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)

FUNCTIONS = "functions."
REASONING_CHANNEL = "analysis"
MESSAGE_ENDS = (END, RETURN)  # what ends a text message (a <|call|> in reasoning is text)
CALL_ENDS = (CALL, END, RETURN)
# What a message's text may begin with when it is a header: the role part's recipient (` to=`
# right after the prompt's `<|start|>assistant`) or one of the header's markers.
HEADER_STARTS = (START, CHANNEL, MESSAGE, CONSTRAIN, "to=")
# Text with no header (a model that skipped it) runs until the next message begins.
BARE_TEXT_ENDS = (END, RETURN, START, CHANNEL)

# A header ends at <|message|>; before it, an end marker or a new message's start makes it one
# the model never finished (garbled: dropped).
HEADER_ENDS = (MESSAGE, END, RETURN, CALL, START)
HEADER_END = re.compile("|".join(re.escape(marker) for marker in HEADER_ENDS))
RECIPIENT = re.compile(r"to=([^\s<]+)")
CHANNEL_NAME = re.compile(r"\s*([^\s<]*)")
# The pieces of JSON text that decide where an object ends: whole strings (possessive, so a
# long string is one step), brackets, and a string's opening quote that never closed.
JSON_PIECE = re.compile(r'"(?:[^"\\]++|\\.)*+"|[{}\[\]]|"')
# What may settle a call's body that has not ended: the bracket that closes its JSON object, a
# call's end, or the next message's start.
CALL_BODY_STOPS = ("}", "]", *CALL_ENDS, START)

# Where a text starts (ParseContext.state), besides None (the output's start), REASONING (an
# analysis message's body) and CONTENT (the body of a message the user sees):
BETWEEN = "between"  # where a message (its header, or text with none) may begin
BARE = "bare"  # text with no header
BUILTIN = "builtin"  # the body of a built-in tool's call (skipped)
# ("call", NAME): the body of a call of the function NAME


@dataclass(frozen=True)
class Header:
    channel: str
    recipient: str | None

    @property
    def function(self) -> str | None:
        """The function a call message names (None when the message is no call of a function)."""
        if self.recipient and self.recipient.startswith(FUNCTIONS):
            return self.recipient[len(FUNCTIONS):]
        return None

    @property
    def is_builtin_call(self) -> bool:
        """A call of one of Harmony's built-in tools (python, browser.*), not of a function."""
        return self.recipient is not None and self.function is None and self.recipient != "assistant"


@dataclass
class Step:
    """One part of the output read (a header, or a body): its segments, and where the next part
    begins and what it is (`next` None: nothing more to read now: the output ended, or what
    follows waits for more text, and `open` says where the reading goes on from)."""

    segments: list[Segment]
    next: int | None
    state: Hashable = BETWEEN
    error: str | None = None
    open: Open | None = None


def parse(text: str, context: ParseContext) -> FamilyParse:
    segments: list[Segment] = []
    error = None
    state = context.state
    if state is None:  # the prompt may have written `<|channel|>analysis<|message|>` for the model
        state = REASONING if context.reasoning_open else BETWEEN
    position = 0
    while True:
        step = _read(text, position, state, context)
        segments.extend(segment for segment in step.segments
                        if not isinstance(segment, (Text, Thought)) or segment.text)
        error = step.error or error
        if step.next is None:
            return FamilyParse(tuple(segments), error, step.open)
        position, state = step.next, step.state


def _read(text: str, start: int, state: Hashable, context: ParseContext) -> Step:
    """The part of the output at `start` that `state` says it is."""
    if state == BETWEEN:
        return _read_header(text, start, context)
    if state == REASONING:
        return _read_text_body(text, start, state, Thought, MESSAGE_ENDS, context)
    if state == CONTENT:
        return _read_text_body(text, start, state, Text, MESSAGE_ENDS, context)
    if state == BARE:
        return _read_text_body(text, start, state, Text, BARE_TEXT_ENDS, context, keep_end=(START, CHANNEL))
    if state == BUILTIN:
        return _skip_builtin_call(text, start, context)
    _, name = state
    step = _read_call(text, start, name, context)
    if step.error == CUT_OFF:  # the call as written, its header's markers included: dropped whole
        return Step([], None, error=CUT_OFF)
    return step


def _read_header(text: str, start: int, context: ParseContext) -> Step:
    """A message's header, from `start` (whitespace may come first): the body it opens is the
    next part; text with no header is a bare body."""
    begins = skip_space(text, start)
    waits = Step([], None, open=Open(start, BETWEEN))  # read again from here at the next piece
    if begins == len(text):
        return waits  # whitespace between messages, or after the last
    if not context.final and any(opener.startswith(text[begins:]) for opener in HEADER_STARTS):
        return waits  # text that may begin a header
    if not text.startswith(HEADER_STARTS, begins):
        return Step([], start, BARE)
    opening = len(START) if text.startswith(START, begins) else 0
    found = HEADER_END.search(text, begins + opening)
    if found is None:  # not finished: more text, or (at the end) a header the model never ended
        return Step([], None, open=Open(start, BETWEEN, None, HEADER_ENDS))
    if found.group() == START:
        return Step([], found.start())  # garbled: a new message begins before this one's <|message|>
    if found.group() != MESSAGE:
        return Step([], found.end())  # garbled: ended without a body (`<|channel|>??<|end|>`)
    header = _header_of(text[begins + opening:found.start()])
    if header.function is not None:
        return Step([], found.end(), ("call", header.function))
    if header.is_builtin_call:
        return Step([], found.end(), BUILTIN)
    return Step([], found.end(), REASONING if header.channel == REASONING_CHANNEL else CONTENT)


def _header_of(header: str) -> Header:
    """`assistant to=functions.f<|channel|>commentary <|constrain|>json` as channel and recipient.
    A stray channel before the real one (`<|channel|>commentary to=assistant<|channel|>analysis`,
    which gpt-oss-20b writes at times) is left out: the last channel counts."""
    role, _, channel_part = header.rpartition(CHANNEL) if CHANNEL in header else (header, "", "")
    role = role.split(CHANNEL, 1)[0]
    name = CHANNEL_NAME.match(channel_part).group(1).split("to=", 1)[0]
    recipient = RECIPIENT.search(channel_part) or RECIPIENT.search(role)
    return Header(name, recipient.group(1) if recipient else None)


def _read_text_body(text: str, start: int, state: Hashable, kind: type[Text] | type[Thought],
                    ends: tuple[str, ...], context: ParseContext, keep_end: tuple[str, ...] = ()) -> Step:
    """A body of text up to its end marker; `keep_end`: end markers that begin the next message.
    Until one comes, more text is more of the body."""
    end, marker = _first_of(text, start, ends)
    if end < 0:  # not ended: all of it so far, less what may begin its end
        at = len(text) if context.final else len(text) - held_back(text[start:], ends)
        return Step([kind(text[start:at])], None, open=Open(at, state, kind, ends))
    return Step([kind(text[start:end])], end if marker in keep_end else end + len(marker))


def _read_call(text: str, start: int, name: str, context: ParseContext) -> Step:
    """A call's body: the JSON object of its arguments, then its end (<|call|>, <|end|>) or the
    output's. One that is no JSON object is given back as content (its body as written; the
    header's markers are left out) with `error` saying why; one cut off by the end of the output
    comes back with CUT_OFF (the caller drops it, header and all). Until it ends it is read
    again from its start, with the name (its header is behind)."""
    waits = Step([], None, open=Open(start, ("call", name), None, CALL_BODY_STOPS))
    body = skip_space(text, start)
    if body == len(text) and not context.final:
        return replace(waits, open=Open(start, ("call", name)))  # its first character says what it is
    if text.startswith("{", body):
        step = _read_json_call(text, start, body, name, context, waits)
        if step is not None:
            return step
    end, marker = _first_of(text, start, CALL_ENDS)
    if end < 0:
        return Step([], None, error=CUT_OFF) if context.final else waits
    arguments = json_object_text(text[start:end])
    if arguments is None:
        why = f"the model's call of {name} has arguments that are not a JSON object"
        return Step([Text(text[start:end])], end + len(marker), error=why)
    return Step([Call(name, arguments)], end + len(marker))


def _read_json_call(text: str, start: int, body: int, name: str, context: ParseContext, waits: Step) -> Step | None:
    """The call when its body is a JSON object followed by its end; None when it is not (the
    body is then read up to the first end marker)."""
    closed = _json_object_end(text, body)
    if closed is None:  # the object has not closed: more text (its arguments stream), or a call cut off
        if context.final:
            return Step([], None, error=CUT_OFF)
        partial = PartialCall(name, text[body:])
        return Step([partial], None, open=replace(waits.open, reread_after=reread_pace(partial)))
    arguments = json_object_text(text[body:closed])
    if arguments is None:
        return None
    after = skip_space(text, closed)
    # What follows the object decides, character by character: read again at every piece.
    undecided = replace(waits, open=Open(start, ("call", name)))
    if after == len(text):  # the output ended after the object (its stop token, <|call|>, cut)
        return Step([Call(name, arguments)], len(text)) if context.final else undecided
    end_marker = next((marker for marker in CALL_ENDS if text.startswith(marker, after)), None)
    if end_marker is not None:
        return Step([Call(name, arguments)], after + len(end_marker))
    if text.startswith(START, after):  # the next message begins without this one's end
        return Step([Call(name, arguments)], after)
    if not context.final and any(marker.startswith(text[after:]) for marker in (*CALL_ENDS, START)):
        return undecided
    return None


def _json_object_end(text: str, start: int) -> int | None:
    """Where the JSON object that opens at `start` closes (just after its `}`), or None when it
    has not closed yet. Marker strings inside its strings are text."""
    depth = 0
    for piece in JSON_PIECE.finditer(text, start):
        token = piece.group()
        if token == '"':
            return None  # a string that has not closed
        if token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
            if depth == 0:
                return piece.end()
    return None


def _skip_builtin_call(text: str, start: int, context: ParseContext) -> Step:
    """A call of a built-in tool that was not offered: nothing to show (llama.cpp drops it too)."""
    end, marker = _first_of(text, start, CALL_ENDS)
    if end < 0:
        at = len(text) if context.final else len(text) - held_back(text[start:], CALL_ENDS)
        return Step([], None, open=Open(at, BUILTIN, None, CALL_ENDS))
    return Step([], end + len(marker))


def _first_of(text: str, start: int, markers: tuple[str, ...]) -> tuple[int, str]:
    """The first of `markers` at or after `start`: (its index, the marker); (-1, "") when none."""
    found = [(index, marker) for marker in markers if (index := text.find(marker, start)) >= 0]
    return min(found) if found else (-1, "")


def template_messages(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """A turn's reasoning as the template reads it, `thinking`, and a turn of calls with its
    reasoning but not its content (llama.cpp's gpt-oss handler)."""
    shaped = []
    for message in messages:
        if isinstance(message.get("reasoning_content"), str):
            message = message | {"thinking": message["reasoning_content"]}
            if message.get("tool_calls"):
                message.pop("content", None)
        shaped.append(message)
    return shaped


FAMILY = Family(
    name="gpt-oss",
    description="Harmony channels: <|channel|>analysis (reasoning), final (content), "
                "to=functions.NAME ...<|message|>{json} (calls) (OpenAI gpt-oss)",
    parse=parse,
    fingerprints=((START + "assistant", CHANNEL, MESSAGE), (CHANNEL + "analysis", MESSAGE)),
    markers=MARKERS,
    reasoning=(CHANNEL + "analysis" + MESSAGE, END),
    priority=40,  # before hermes and the generic format; no other template writes <|channel|>
    # A constrained call: the commentary channel to the function, its JSON, <|call|> (a stop
    # token: one call per turn, as the model was trained). After its reasoning the model opens
    # a new message.
    call_syntax=CallSyntax(call_open=CHANNEL + "commentary to=functions.{name} " + CONSTRAIN + "json" + MESSAGE,
                           call_close=CALL, separator=START + "assistant",
                           reasoning=(CHANNEL + "analysis" + MESSAGE, END + START + "assistant"),
                           constrains_auto=False),
    template_messages=template_messages,
    keeps_developer_role=True,  # the template has a developer message of its own
)
