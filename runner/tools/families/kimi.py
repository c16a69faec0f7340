"""Kimi K2 (Instruct, Thinking, K2.5, K2.6) and Kimi K3: two unrelated formats of one family.

Kimi K2 writes its calls in a section of special tokens; a call's id is `functions.NAME:INDEX`
(the name lives in the id) and its arguments are a JSON object. K2-Thinking and K2.6 reason in
<think>...</think> (K2.6's prompt opens it for the model, so the output starts inside it):

    Two cities.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1
    <|tool_call_argument_begin|>{"city": "Tokyo"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the output; the text before the section is content, and so is the text after it).

Kimi K3 writes XTML: elements built of the special tokens <|open|>, <|close|> and <|sep|>
(`<|open|>NAME attr="v"<|sep|>` ... `<|close|>NAME<|sep|>`). The prompt opens the think element
(or, with thinking off, the response element); then come the response and a tools element of
calls, one argument element per key with its JSON type in an attribute (a string raw, anything
else as JSON):

    Live data needed.<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>
    <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Berlin<|close|>argument<|sep|>
    <|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>

(again one line). Which of the two an output is: the template's variant where it is known,
else the output's own tokens (<|open|>/<|close|> are K3's).

As the output streams, a parse goes on from where the last one settled, the state saying the
format (where the tokens told it) and the place: reasoning and content grow until a marker may
come; a section of calls (a tools element) that has not ended is read again from its opener
when something that may end one of its calls, or it, comes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from typing import Any

from ..family import (CONTENT, CUT_OFF, REASONING, STRICT_JSON, Call, CallSyntax, Family, FamilyParse, Open,
                      ParseContext, PartialCall, Segment, Text, Thought, held_back, may_begin, property_schema,
                      reread_pace, skip_space, string_value_partial, then, typed_value)

# --- Kimi K2's tokens ---
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENTS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
K2_ROLE_TOKENS = ("<|im_end|>", "<|im_assistant|>", "<|im_system|>", "<|im_user|>", "<|im_middle|>")

K2_TOKENS = (THINK_OPEN, THINK_CLOSE, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENTS_BEGIN, CALL_END,
             *K2_ROLE_TOKENS)

# --- Kimi K3's tokens and the tags made of them ---
OPEN, CLOSE, SEP, END_OF_MESSAGE = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
K3_TOKENS = (OPEN, CLOSE, SEP, END_OF_MESSAGE)


def _open_tag(name: str) -> str:
    return f"{OPEN}{name}{SEP}"


def _close_tag(name: str) -> str:
    return f"{CLOSE}{name}{SEP}"


MESSAGE_OPEN, MESSAGE_CLOSE = '<|open|>message role="assistant"<|sep|>', _close_tag("message")
THINKING_OPEN, THINKING_CLOSE = _open_tag("think"), _close_tag("think")
RESPONSE_OPEN, RESPONSE_CLOSE = _open_tag("response"), _close_tag("response")
TOOLS_OPEN, TOOLS_CLOSE = _open_tag("tools"), _close_tag("tools")
K3_CALL_OPEN, K3_CALL_CLOSE = f"{OPEN}call ", _close_tag("call")  # the open tag's attributes follow
ARGUMENT_OPEN, ARGUMENT_CLOSE = f"{OPEN}argument ", _close_tag("argument")
JSON_OPEN, JSON_CLOSE = f"{OPEN}json", _close_tag("json")  # a call's arguments as one JSON object
AFTER_ARGUMENT = (ARGUMENT_OPEN, JSON_OPEN, K3_CALL_CLOSE)  # an argument's closer ends it only before one of these

# Tags that may stand where content goes and are no part of it (the elements around the content,
# a stray end of the reasoning, the end of the turn).
K2_STRAY = (THINK_CLOSE, SECTION_END, ARGUMENTS_BEGIN, CALL_END, *K2_ROLE_TOKENS)
K3_STRAY = (MESSAGE_OPEN, MESSAGE_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, THINKING_CLOSE, END_OF_MESSAGE)
# Both formats drop both's (an output whose format is known only from its tokens reads alike
# before and after the first token that tells).
STRAY = (*K2_STRAY, *K3_STRAY)
# Text that may be the start of any of these waits (the two formats hold back alike, so an
# output whose format is known only from its tokens streams as it reads whole).
HOLD = (SECTION_BEGIN, CALL_BEGIN, THINK_OPEN, TOOLS_OPEN, THINKING_OPEN, *STRAY)

# An output whose format is known only from its tokens (no template said) is read as K2's until
# its first token tells: until then the start of any token of either format waits, so that the
# token is read where it comes (HOLD begins with all of them but <|sep|>).
UNDECIDED_HOLD = (*HOLD, SEP)

MALFORMED = "the model's tool call is not in Kimi's format"

# Where a text starts (ParseContext.state) is a pair: the format (K2 or K3; None while neither's
# tokens have come) and the place: None (the output's start), family.REASONING, family.CONTENT,
# or RAW (after a call that could not be read: all of the rest is content, as written).
K2, K3 = "k2", "k3"
RAW = "raw"


class _Pending(Exception):
    """The text so far ends inside a call or a tag: more text decides it. `stops`: the strings
    without which it stays so (None: any text may decide it)."""

    def __init__(self, stops: tuple[str, ...] | None = None, partial: PartialCall | None = None) -> None:
        super().__init__()
        self.stops, self.partial = stops, partial  # partial: the call as far as it is written (its arguments stream)


class _Malformed(Exception):
    """A call that cannot be read (cut off when `reason` is CUT_OFF)."""

    def __init__(self, reason: str, raw: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.raw = reason, raw  # raw: the text given back as content (where the caller knows it better)


def _unfinished(context: ParseContext, stops: tuple[str, ...] | None = None) -> Exception:
    return _Malformed(CUT_OFF) if context.final else _Pending(stops)


def parse(text: str, context: ParseContext) -> FamilyParse:
    known, place = context.state if context.state is not None else (None, None)
    form = _format(text, context.variant, known)
    parsed = _parse_k3(text, context, place) if form == K3 else _parse_k2(text, context, place, known=form == K2)
    opened = parsed.open
    if opened is not None:
        opened = replace(opened, state=(form, opened.state))
    return FamilyParse(parsed.segments, parsed.error, opened)


def _format(text: str, variant: str | None, known: str | None) -> str | None:
    """The template's variant says; without one, the first of either format's tokens in the
    output (a choice that later text never changes: once made, the state keeps it). None while
    there is none (the text before the first token reads alike in both)."""
    if variant:
        return K3 if "k3" in variant.lower() else K2
    if known is not None:
        return known
    k3_at, k2_at = _first(text, K3_TOKENS)[0], _first(text, K2_TOKENS)[0]
    if k3_at >= 0 and (k2_at < 0 or k3_at < k2_at):
        return K3
    return K2 if k2_at >= 0 else None


# --- shared pieces ----------------------------------------------------------------------------

def _first(text: str, markers: tuple[str, ...], position: int = 0) -> tuple[int, str]:
    """The first of `markers` at or after `position`: (where, which), or (-1, "")."""
    found = [(index, marker) for marker in markers if (index := text.find(marker, position)) >= 0]
    return min(found, key=lambda hit: (hit[0], -len(hit[1]))) if found else (-1, "")


def _without(text: str, markers: tuple[str, ...]) -> str:
    """`text` less the markers, in one pass (what is left of two is never read as a third)."""
    return re.sub("|".join(re.escape(marker) for marker in sorted(markers, key=len, reverse=True)), "", text)


def _waits_for(rest: str, markers: tuple[str, ...], context: ParseContext) -> bool:
    """Whether `rest` (the end of the text) may still become one of `markers`."""
    return not context.final and any(marker.startswith(rest) for marker in markers)


def _reasoning(text: str, context: ParseContext, place: Hashable, opener: str, closers: tuple[str, ...],
               consumed: str, hold: tuple[str, ...], prefix: str = "",
               starts: tuple[str, ...] = ()) -> tuple[FamilyParse, int | None]:
    """The reasoning at the start of the output: (its parse, where the text after it starts;
    None while its end has not come). The block ends at `consumed` (its closer, dropped) or at
    the first of the other `closers` (the next element, kept: a model may skip the closer).
    While the output's start may still become `prefix` (the turn's own header, where the prompt
    left it out), the opener or one of `starts`, it waits: read on from inside the block, the
    opener would be reasoning."""
    if place == REASONING:
        start = 0
    elif place is not None:  # the block is behind
        return FamilyParse(()), 0
    else:
        begins = skip_space(text, 0)
        if prefix and text.startswith(prefix, begins):
            begins, prefix = skip_space(text, begins + len(prefix)), ""
        if not context.final and may_begin(text, begins, (prefix, opener, *starts) if prefix else (opener, *starts)):
            return FamilyParse((), open=Open(0)), None
        if text.startswith(opener, begins):
            start = begins + len(opener)
        elif context.reasoning_open:
            start = begins
        else:
            return FamilyParse(()), begins
    end, closer = _first(text, closers, start)
    if end >= 0:
        return FamilyParse((Thought(text[start:end]),)), end + len(closer) if closer == consumed else end
    if context.final:
        return FamilyParse((Thought(text[start:]),)), None
    at = len(text) - held_back(text[start:], hold)
    return FamilyParse((Thought(text[start:at]),), open=Open(at, REASONING, Thought, hold)), None


def _content(text: str, position: int, context: ParseContext, segments: list[Segment],
             hold: tuple[str, ...]) -> FamilyParse:
    """The content from `position` to the end (less what may begin a marker, while the output
    grows), the stray tags dropped: more text is more content until one of `hold` comes."""
    at = len(text) if context.final else len(text) - held_back(text[position:], hold)
    segments.append(Text(_without(text[position:at], STRAY)))
    return FamilyParse(tuple(segments), open=Open(at, CONTENT, Text, hold))


def _raw(text: str) -> FamilyParse:
    """The text after a call that could not be read: all of it content, as written."""
    return FamilyParse((Text(text),) if text else (), open=Open(len(text), RAW, Text, ()))


# A reader of calls: (text, where they start, context, the segments to add them to) -> where
# the text after them starts; _Pending while they have not ended, _Malformed where they cannot.
CallsReader = Callable[[str, int, ParseContext, list[Segment]], int]


def _calls(text: str, start: int, context: ParseContext, segments: list[Segment],
           read: CallsReader) -> int | FamilyParse:
    """The calls that `read` reads at `start` (onto `segments`): where the text after them
    starts, or the parse where they do not end here. Calls not yet ended are read again from
    `start` (those read already come again) when something that may end them comes; a call
    cut off by the end of the output is dropped; one that cannot be read is content, its raw
    text and all after it."""
    before = len(segments)
    try:
        return read(text, start, context, segments)
    except _Pending as pending:  # a call whose arguments stream is read again at a pace too
        partial, pace = ((pending.partial,), reread_pace(pending.partial)) if pending.partial else ((), 0)
        return FamilyParse((*segments, *partial),
                           open=Open(start, CONTENT, None, pending.stops, len(segments) - before, pace))
    except _Malformed as problem:
        if problem.reason == CUT_OFF:  # a call cut off by the end of the output was a call: dropped
            return FamilyParse(tuple(segments), CUT_OFF)
        raw = problem.raw if problem.raw is not None else text[start:]
        return FamilyParse(tuple(segments) + (Text(raw),), problem.reason, Open(len(text), RAW, Text, ()))


def _body(text: str, context: ParseContext, hold: tuple[str, ...], readers: Mapping[str, CallsReader]) -> FamilyParse:
    """The content and calls after the reasoning: at each opener of `readers`, calls its reader reads."""
    segments: list[Segment] = []
    position = 0
    while True:
        start, marker = _first(text, tuple(readers), position)
        if start < 0:
            return _content(text, position, context, segments, hold)
        segments.append(Text(_without(text[position:start], STRAY)))
        after = _calls(text, start, context, segments, readers[marker])
        if isinstance(after, FamilyParse):
            return after
        position = after


def _section_reader(opener: str, call_opener: str, closer: str,
                    read_call: Callable[[str, int, ParseContext], tuple[Call, int]]) -> CallsReader:
    """A reader of a section of calls (K2's section, K3's tools element): its calls into
    `segments`, and the position after it. Text between calls is noise the model wrote inside
    the section: dropped. A call that cannot be read gives its raw text (from the section's start
    when no call came before it) as content."""
    def read(text: str, start: int, context: ParseContext, segments: list[Segment]) -> int:
        position, calls = start + len(opener), 0
        while True:
            found, marker = _first(text, (call_opener, closer), position)
            if found < 0:
                if not context.final:
                    raise _Pending((call_opener, closer))
                if calls:
                    return len(text)  # the section never closed, but its calls did
                raise _Malformed(CUT_OFF, text[start:])
            if marker == closer:
                return found + len(closer)
            try:
                call, position = read_call(text, found, context)
            except _Malformed as problem:
                raise _Malformed(problem.reason, text[found if calls else start:]) from None
            segments.append(call)
            calls += 1
    return read


# --- Kimi K2 ----------------------------------------------------------------------------------

def _parse_k2(text: str, context: ParseContext, place: Hashable, known: bool) -> FamilyParse:
    """K2's reading; also of an output whose format is not `known` yet (no token of either
    came), which waits at its start for K3's opening tags too, and holds back the start of any
    token of either format."""
    if place == RAW:
        return _raw(text)
    hold = HOLD if known else UNDECIDED_HOLD
    # K2-Thinking may call tools from inside its reasoning, without closing it.
    reasoning, body = _reasoning(text, context, place, THINK_OPEN, (THINK_CLOSE, SECTION_BEGIN, CALL_BEGIN),
                                 THINK_CLOSE, hold, starts=() if known else (MESSAGE_OPEN, THINKING_OPEN))
    if body is None:
        return reasoning
    # A call may come without its section (K2-Thinking, inside its reasoning).
    return then(reasoning, body, _body(text[body:], context, hold,
                                       {SECTION_BEGIN: _read_k2_section, CALL_BEGIN: _read_k2_bare_call}))


def _read_k2_bare_call(text: str, start: int, context: ParseContext, segments: list[Segment]) -> int:
    """One call without its section, into `segments`; the position after it."""
    call, position = _read_k2_call(text, start, context)
    segments.append(call)
    return position


def _read_k2_call(text: str, start: int, context: ParseContext) -> tuple[Call, int]:
    """`<|tool_call_begin|>ID<|tool_call_argument_begin|>{...}<|tool_call_end|>` at `start`.

    The arguments end where their JSON object ends (a string in them may hold the end marker's
    text). Where the end marker is missing, the next call or the section's end ends the call,
    or the end of the output (as llama.cpp reads K2-Thinking's looser calls)."""
    head = start + len(CALL_BEGIN)
    arguments_at = text.find(ARGUMENTS_BEGIN, head)
    if arguments_at < 0:
        if _first(text, (CALL_BEGIN, CALL_END), head)[1]:
            raise _Malformed(MALFORMED)
        raise _unfinished(context, (ARGUMENTS_BEGIN, CALL_BEGIN, CALL_END))
    call_id = text[head:arguments_at].strip()
    if "<|" in call_id:  # another marker came before this call's arguments
        raise _Malformed(MALFORMED)
    name = _name_of_id(call_id)
    json_start = len(text) - len(text[arguments_at + len(ARGUMENTS_BEGIN):].lstrip())
    try:
        arguments, json_end = STRICT_JSON.raw_decode(text, json_start)
    except ValueError:
        # Unfinished JSON may hold the end marker's text in a string: only the end decides. An
        # object is whole only at a closing brace; anything else may be decided by any text.
        if not context.final:  # an object's text as it will read: its arguments stream
            is_object = text.startswith("{", json_start)
            partial = PartialCall(name, text[json_start:]) if is_object and name else None
            raise _Pending(("}",) if is_object else None, partial) from None
        raise _Malformed(MALFORMED if CALL_END in text[json_start:] else CUT_OFF) from None
    if not name or not isinstance(arguments, dict):
        raise _Malformed(MALFORMED)
    call = Call(name, text[json_start:json_end])
    after = len(text) - len(text[json_end:].lstrip())
    if text.startswith(CALL_END, after):
        return call, after + len(CALL_END)
    if _first(text, (CALL_BEGIN, SECTION_END), after)[0] == after or (context.final and after == len(text)):
        return call, after
    if _waits_for(text[after:], (CALL_END, CALL_BEGIN, SECTION_END), context):
        raise _Pending()  # what follows the object decides, character by character
    raise _Malformed(MALFORMED)


_read_k2_section = _section_reader(SECTION_BEGIN, CALL_BEGIN, SECTION_END, _read_k2_call)


def _name_of_id(call_id: str) -> str:
    """`functions.get_weather:0` -> `get_weather` (an id without the prefix or the index too)."""
    name = call_id.removeprefix("functions.")
    numbered = re.fullmatch(r"(.+):\d+", name)
    return numbered.group(1) if numbered else name


# --- Kimi K3 ----------------------------------------------------------------------------------

def _parse_k3(text: str, context: ParseContext, place: Hashable) -> FamilyParse:
    if place == RAW:
        return _raw(text)
    # The reasoning ends at its closer, or at the next element where the model skipped it.
    reasoning, body = _reasoning(text, context, place, THINKING_OPEN, (THINKING_CLOSE, RESPONSE_OPEN, TOOLS_OPEN),
                                 THINKING_CLOSE, HOLD, prefix=MESSAGE_OPEN)
    if body is None:
        return reasoning
    return then(reasoning, body, _body(text[body:], context, HOLD, {TOOLS_OPEN: _read_k3_tools}))


def _read_k3_call(text: str, start: int, context: ParseContext) -> tuple[Call, int]:
    """`<|open|>call tool="NAME" index="N"<|sep|>` arguments `<|close|>call<|sep|>` at `start`."""
    attributes, position = _open_tag_attributes(text, start + len(K3_CALL_OPEN), context)
    name = attributes.get("tool", "")
    if not name:
        raise _Malformed(MALFORMED)
    schema = context.schema_of(name)
    arguments: dict[str, Any] = {}
    while True:
        position = len(text) - len(text[position:].lstrip())
        if text.startswith(K3_CALL_CLOSE, position):
            return Call(name, json.dumps(arguments, ensure_ascii=False)), position + len(K3_CALL_CLOSE)
        if text.startswith(ARGUMENT_OPEN, position):
            attributes, value_start = _open_tag_attributes(text, position + len(ARGUMENT_OPEN), context)
            key = attributes.get("key", "")
            try:
                value_end = _element_end(text, value_start, ARGUMENT_CLOSE, context)
            except _Pending as pending:  # a string value streams as it is written
                raise _Pending(pending.stops, _string_so_far(name, arguments, key, text[value_start:], attributes.get(
                    "type"), property_schema(schema, key))) from None
            arguments[key] = _typed(text[value_start:value_end], attributes.get("type"), property_schema(schema, key))
            position = value_end + len(ARGUMENT_CLOSE)
        elif text.startswith(JSON_OPEN, position):
            _, value_start = _open_tag_attributes(text, position + len(JSON_OPEN), context)
            value_end = _element_end(text, value_start, JSON_CLOSE, context)
            try:
                value = STRICT_JSON.decode(text[value_start:value_end])
            except ValueError:
                raise _Malformed(MALFORMED) from None
            if not isinstance(value, dict):
                raise _Malformed(MALFORMED)
            arguments.update(value)
            position = value_end + len(JSON_CLOSE)
        elif _waits_for(text[position:], (K3_CALL_CLOSE, ARGUMENT_OPEN, JSON_OPEN), context) or position == len(text):
            raise _unfinished(context)  # the next tag decides, character by character
        else:
            raise _Malformed(MALFORMED)


_read_k3_tools = _section_reader(TOOLS_OPEN, K3_CALL_OPEN, TOOLS_CLOSE, _read_k3_call)


def _open_tag_attributes(text: str, position: int, context: ParseContext) -> tuple[dict[str, str], int]:
    """The attributes of the open tag whose attributes start at `position`, and where its
    content starts (after <|sep|>)."""
    end = text.find(SEP, position)
    if end < 0:
        raise _unfinished(context, (SEP,))
    attributes = {key: _unescape(value) for key, value in re.findall(r'([\w-]+)="([^"]*)"', text[position:end])}
    return attributes, end + len(SEP)


def _unescape(value: str) -> str:
    """An attribute's text: the template escapes & and " (escape_attr)."""
    entities = {"amp": "&", "quot": '"', "lt": "<", "gt": ">", "apos": "'"}
    return re.sub(r"&(amp|quot|lt|gt|apos);", lambda match: entities[match.group(1)], value)


def _element_end(text: str, start: int, closer: str, context: ParseContext) -> int:
    """Where an argument's value ends. A value may hold the closer's text (a file about this
    format), so a closer counts only where the next argument or the call's end follows it."""
    position = text.find(closer, start)
    while position >= 0:
        following = text[position + len(closer):].lstrip()
        if following.startswith(AFTER_ARGUMENT):
            return position
        if _waits_for(following, AFTER_ARGUMENT, context):
            raise _Pending()  # what follows the closer decides, character by character
        position = text.find(closer, position + 1)
    raise _unfinished(context, (closer,))


def _string_so_far(name: str, arguments: dict[str, Any], key: str, raw: str, declared: str | None,
                   schema: Mapping[str, Any]) -> PartialCall | None:
    """The call as far as it is written while a string argument is: its text up to the first
    closer that may end it (one whose next tag may still come), or to what may begin one."""
    if (declared or schema.get("type")) != "string":
        return None
    cut = raw.find(ARGUMENT_CLOSE)
    while cut >= 0 and not may_begin(following := raw[cut + len(ARGUMENT_CLOSE):].lstrip(), 0, AFTER_ARGUMENT) \
            and not following.startswith(AFTER_ARGUMENT):
        cut = raw.find(ARGUMENT_CLOSE, cut + 1)  # text follows it: part of the value
    return string_value_partial(name, arguments, key, raw[:cut] if cut >= 0 else
                                raw[:len(raw) - held_back(raw, (ARGUMENT_CLOSE,))])


def _typed(raw: str, declared: str | None, schema: Mapping[str, Any]) -> Any:
    """A value as its type attribute says (a string stays text); the schema where it has none."""
    if declared in {"string", "number", "integer", "boolean", "null", "object", "array"}:
        return typed_value(raw, {"type": declared})
    return typed_value(raw, schema)


# --- the family -------------------------------------------------------------------------------

class _KimiFamily(Family):
    """Kimi's family: K3's prompt opens its reasoning with <|open|>think<|sep|>, not <think>."""

    def opens_reasoning(self, prompt: str) -> bool:
        start = prompt.rfind(THINKING_OPEN)
        after = prompt[start + len(THINKING_OPEN):]
        k3_open = start >= 0 and THINKING_CLOSE not in after and not after.strip()
        return k3_open or super().opens_reasoning(prompt)


FAMILY = _KimiFamily(
    name="kimi",
    description="Kimi K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>"
                "{...}<|tool_call_end|>...; Kimi K3: <|open|>tools<|sep|><|open|>call tool=...<|sep|> XTML; "
                "reasoning in <think>...</think> (K3: <|open|>think<|sep|>)",
    parse=parse,
    fingerprints=((SECTION_BEGIN, CALL_BEGIN), (OPEN, CLOSE, END_OF_MESSAGE)),
    markers=(SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENTS_BEGIN, CALL_END, THINK_OPEN, THINK_CLOSE,
             *K2_ROLE_TOKENS, OPEN, CLOSE, SEP, END_OF_MESSAGE),
    reasoning=(THINK_OPEN, THINK_CLOSE),
    priority=40,
    variants={"kimi-k3": (OPEN, CLOSE, END_OF_MESSAGE), "kimi-k2": (SECTION_BEGIN,)},
    variant_call_syntax={"kimi-k2": CallSyntax(block_open=SECTION_BEGIN, block_close=SECTION_END, call_close=CALL_END,
                                               call_open=CALL_BEGIN + "functions.{name}:{index}" + ARGUMENTS_BEGIN),
                         "kimi-k3": CallSyntax(  # forced calls only: free text cannot hold the response's closer
        reasoning=(THINKING_OPEN, THINKING_CLOSE + RESPONSE_OPEN), content_close=RESPONSE_CLOSE, constrains_auto=False,
        block_open=TOOLS_OPEN, block_close=TOOLS_CLOSE + MESSAGE_CLOSE, call_close=K3_CALL_CLOSE, call_open=K3_CALL_OPEN
        + 'tool="{name}" index="{index}"' + SEP, parameter_open=ARGUMENT_OPEN + 'key="{key}" type="{type}"' + SEP,
        parameter_close=ARGUMENT_CLOSE, attribute_escapes=(("&", "&amp;"), ('"', "&quot;")))},
)
