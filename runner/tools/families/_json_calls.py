"""Pieces shared by the families whose calls are JSON objects of a name and its arguments
(hermes, mistral, llama3, generic): reading such an object and the JSON around it, and the
reasoning these formats may start with.

Not a family (the registry skips modules whose name starts with "_"). Every reader here is a
plain function of the text that raises `Pending` where the text ends before what it reads does
(while the output grows, more text decides it; at its end, the call was cut off) and `Malformed`
where the text is not what it reads, with the sentence ParsedOutput.error gives.

A malformed call is content from its start (or from the end of the last whole call of its
group) to the end of the output; a call cut off by the end of the output is dropped. JSON is
validated by the standard library; only where a value ends (strings, escapes, nesting) is found
here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..family import (CONTENT, CUT_OFF, REASONING, Call, CallSyntax, FamilyParse, Open, ParseContext, PartialCall,
                      Segment, Text, Thought, first_found, held_back, reread_pace, skip_space)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

NAME_KEY = "name"
ARGUMENTS_KEYS = ("arguments", "parameters")  # Llama 3 writes "parameters", the others "arguments"
NO_ARGUMENTS = "{}"

JSON_WHITESPACE = " \t\n\r"
JSON_STRING_ESCAPES = (("\\", "\\\\"), ('"', '\\"'))  # a name inside a JSON string, as json.dumps writes it
SCALAR_ENDS = JSON_WHITESPACE + ",:]}"  # what ends a number, true, false or null

NOT_JSON = "the model's tool call is not valid JSON"
NO_NAME = "the model's tool call names no function"
ARGUMENTS_NOT_OBJECT = "the model's tool call arguments are not a JSON object"
ERROR_EXCERPT_CHARS = 60  # of the malformed JSON, quoted in ParsedOutput.error


def json_call_syntax(before: str = "", after: str = "", key: str = "arguments", **placement) -> CallSyntax:
    """Calls written {"name": NAME, "KEY": ARGUMENTS} with json.dumps' separators, each between
    `before` and `after` (placement: CallSyntax's block, separator, trigger...), after a
    <think> block where the template reasons: the grammar of the JSON-call formats."""
    return CallSyntax(call_open=before + '{"name": "{name}", "' + key + '": ', call_close="}" + after,
                      attribute_escapes=JSON_STRING_ESCAPES, reasoning=(THINK_OPEN, THINK_CLOSE), **placement)

STRICT_JSON = json.JSONDecoder()
# The pieces of JSON text that decide where a value ends: whole strings (possessive, so a long
# string is one step), brackets, and a string's opening quote that never closed.
JSON_PIECE = re.compile(r'"(?:[^"\\]++|\\.)*+"|[{}\[\]]|"')
SCALAR_END = re.compile(r"[ \t\n\r,:\]}]")

# A group of calls (an array, a call object) has ended only at a closing bracket: until one
# comes, nothing of it needs reading again.
JSON_CLOSERS = ("}", "]")

# The states these formats resume in, besides family.CONTENT and family.REASONING: the body's
# start (where a call may be written bare, as JSON), and the text after a call that could not be
# read (all of it content).
BODY = "body"
RAW = "raw"


class Pending(Exception):
    """The text ends before what is being read does; `partial`: the call being read, where its
    name is known and its arguments began as an object (they stream as they are written)."""

    def __init__(self, partial: PartialCall | None = None, in_call: bool = False) -> None:
        super().__init__()
        self.partial = partial
        self.in_call = in_call or partial is not None  # inside a call object: read again at every piece


class Malformed(Exception):
    """Text that began a call is not one; `reason` is the sentence for ParsedOutput.error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class JsonValue:
    text: str  # as the model wrote it
    value: Any  # as json decodes it


def skip_json_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in JSON_WHITESPACE:
        position += 1
    return position


def next_char(text: str, position: int) -> str:
    """The character at `position`; Pending at the end of the text."""
    if position >= len(text):
        raise Pending
    return text[position]


def expect(text: str, position: int, char: str, what: str) -> int:
    """Past `char` (after JSON whitespace)."""
    position = skip_json_space(text, position)
    found = next_char(text, position)
    if found != char:
        raise Malformed(f"{NOT_JSON}: expected {what}, found {found!r}")
    return position + 1


def scan_value(text: str, position: int, final: bool, scalar_end: re.Pattern[str] = SCALAR_END) -> tuple[JsonValue, int]:
    """One JSON value whole (after whitespace), and where it ends. Where it ends is found by
    tracking strings and nesting (a number or a literal ends at `scalar_end`); json validates
    it once it is whole."""
    start = skip_json_space(text, position)
    first = next_char(text, start)
    if first not in '{["':
        found = scalar_end.search(text, start)
        if found is None and not final:
            raise Pending  # a number may go on
        end = len(text) if found is None else found.start()
    else:
        end = _bracketed_end(text, start)
    value_text = text[start:end]
    return JsonValue(value_text, decode(value_text)), end


def _bracketed_end(text: str, start: int) -> int:
    depth = 0
    for piece in JSON_PIECE.finditer(text, start):
        token = piece.group()
        if token == '"':
            raise Pending  # a string that has not closed
        if token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
        if depth <= 0:
            return piece.end()
    raise Pending


def decode(text: str) -> Any:
    try:
        return STRICT_JSON.decode(text)
    except json.JSONDecodeError as problem:
        raise Malformed(f"{NOT_JSON}: {problem.msg} in {excerpt(text)}") from None


def excerpt(text: str) -> str:
    """The text, shortened for an error sentence."""
    return text if len(text) <= ERROR_EXCERPT_CHARS else text[:ERROR_EXCERPT_CHARS] + "..."


def next_key(text: str, position: int, is_first: bool, final: bool) -> tuple[str | None, int]:
    """The next key of an object being read and where its value starts (its ':' read), or None
    at its '}' (read)."""
    position = skip_json_space(text, position)
    found = next_char(text, position)
    if found == "}":
        return None, position + 1
    if not is_first:
        if found != ",":
            raise Malformed(f"{NOT_JSON}: expected ',' or '}}', found {found!r}")
        position = skip_json_space(text, position + 1)
        found = next_char(text, position)
    if found != '"':
        raise Malformed(f"{NOT_JSON}: expected a key in double quotes, found {found!r}")
    key, position = scan_value(text, position, final)
    return key.value, expect(text, position, ":", "':' after a key")


def call_object(text: str, position: int, final: bool) -> tuple[Call, int]:
    """One {"name": ..., "arguments": {...}} object (other keys are skipped), and where it ends;
    Pending inside it says so (with the call as far as it is written, once its name is known
    and its arguments began)."""
    position = expect(text, position, "{", "'{' to begin the call")
    try:
        return _call_members(text, position, final)
    except Pending as pending:
        raise Pending(pending.partial, in_call=True) from None


def _call_members(text: str, position: int, final: bool) -> tuple[Call, int]:
    name = arguments = None
    is_first = True
    while True:
        key, position = next_key(text, position, is_first, final)
        if key is None:
            break
        is_first = False
        if key == NAME_KEY and name is None:
            value, position = scan_value(text, position, final)
            if not isinstance(value.value, str) or not value.value:
                raise Malformed(NO_NAME)
            name = value.value
        elif key in ARGUMENTS_KEYS and arguments is None:
            try:
                arguments, position = arguments_at(text, position, final)
            except Pending:
                start = skip_json_space(text, position)
                if name is not None and text.startswith("{", start):  # written as they will read: stream them
                    raise Pending(PartialCall(name, text[start:])) from None
                raise
        else:
            _, position = scan_value(text, position, final)
    if name is None:
        raise Malformed(NO_NAME)
    return Call(name, arguments if arguments is not None else NO_ARGUMENTS), position


def arguments_at(text: str, position: int, final: bool) -> tuple[str, int]:
    """The arguments' JSON text: an object as written, or a string holding one unwrapped."""
    start = skip_json_space(text, position)
    first = next_char(text, start)
    if first == "{":
        value, end = scan_value(text, start, final)
        return value.text, end
    if first == '"':
        value, end = scan_value(text, start, final)
        return unwrapped_arguments(value.value), end
    raise Malformed(ARGUMENTS_NOT_OBJECT)


def unwrapped_arguments(value: Any) -> str:
    """Arguments written as a string that holds an object's JSON: that JSON text."""
    if not isinstance(value, str):
        raise Malformed(ARGUMENTS_NOT_OBJECT)
    inner = value.strip()
    try:
        is_object = isinstance(STRICT_JSON.decode(inner), dict)
    except json.JSONDecodeError:
        is_object = False
    if not is_object:
        raise Malformed(ARGUMENTS_NOT_OBJECT)
    return inner


class Progress:
    """The calls of a group as they are read, and where the text after the last one starts
    (the raw text of a call that cannot be read starts there)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.after_last: int | None = None
        # The text ended between two calls of the group, where what comes next (another call,
        # or the text after the group) may be any character.
        self.between_calls = False

    def add(self, call: Call, end: int) -> None:
        self.calls.append(call)
        self.after_last = end


def call_array(text: str, position: int, final: bool, progress: Progress) -> int:
    """A JSON array of call objects; where it ends."""
    position = expect(text, position, "[", "'['")
    position = skip_json_space(text, position)
    if next_char(text, position) == "]":
        return position + 1
    while True:
        call, position = call_object(text, position, final)
        progress.add(call, position)
        position = skip_json_space(text, position)
        following = next_char(text, position)
        position += 1
        if following == "]":
            return position
        if following != ",":
            raise Malformed(f"{NOT_JSON}: expected ',' or ']' after a call, found {following!r}")


# --- bodies of content and groups of calls -------------------------------------------------------

GroupReader = Callable[[str, int, bool, Progress], int]  # (text, start, final, progress) -> where it ends


class Body:
    """The segments of a body of content and groups of calls, as they are read."""

    def __init__(self, text: str, context: ParseContext) -> None:
        self.text = text
        self.context = context
        self.segments: list[Segment] = []
        self.error: str | None = None

    def add_text(self, text: str) -> None:
        if text:
            self.segments.append(Text(text))

    def parse(self, opened: Open | None) -> FamilyParse:
        return FamilyParse(tuple(self.segments), self.error, None if self.context.final else opened)

    def group(self, start: int, group_start: int, read: GroupReader, state: str,
              stops: Sequence[str] | None) -> int | FamilyParse:
        """A group of calls read by `read` from `group_start` (`start`: where its marker begins):
        where the text after it starts, or the body's parse where the group does not end here.
        One that has not ended waits (read again from `start`, in `state`, when one of `stops`
        comes); one cut off by the end of the output is dropped (the calls before it stand);
        one that cannot be read is content, its raw text (from the end of its last whole call)
        and all after it."""
        text, final = self.text, self.context.final
        progress = Progress()
        try:
            end = read(text, group_start, final, progress)
        except Pending as pending:
            self.segments.extend(progress.calls)
            if not final:
                # A call whose arguments stream is read again at every piece (from its group's start).
                # Before a call's object opens, its '{' is a stop too: from there its arguments
                # stream, read again at a pace as they grow.
                waits_for = None if stops is None or progress.between_calls else (*stops, "{")
                if pending.partial is not None:
                    self.segments.append(pending.partial)
                pace = reread_pace(pending.partial) if pending.in_call and waits_for is not None else 0
                return self.parse(Open(start, state, None, waits_for, repeats=len(progress.calls), reread_after=pace))
            self.error = CUT_OFF
            return self.parse(None)
        except Malformed as problem:
            self.segments.extend(progress.calls)
            self.error = problem.reason
            self.add_text(text[start if progress.after_last is None else progress.after_last:])
            return self.parse(Open(len(text), RAW, Text, ()))
        self.segments.extend(progress.calls)
        return end


def read_raw(text: str, context: ParseContext) -> FamilyParse:
    """The text after a call that could not be read: all of it content."""
    return FamilyParse((Text(text),) if text else (), open=None if context.final else Open(len(text), RAW, Text, ()))


def past_close(text: str, position: int, final: bool, close: str, unclosed: str) -> int:
    """Where the text after a call block's `close` marker starts (space before it skipped): past
    it, or the output's end where the marker was cut short (or left out) there. Pending while the
    output may still write it; Malformed(unclosed) where other text stands there."""
    position = skip_space(text, position)
    if text.startswith(close, position):
        return position + len(close)
    if close.startswith(text[position:]):
        if not final:
            raise Pending
        return len(text)
    raise Malformed(unclosed)


def marked_groups(text: str, context: ParseContext, marker: str, read: GroupReader,
                  stops: Sequence[str]) -> FamilyParse:
    """A body of content and groups of calls that `marker` opens (Hermes' <tool_call>, Mistral's
    [TOOL_CALLS], Phi-4-mini's <|tool_call|>), each read by `read` from after its marker and, while
    it has not ended, read again when one of `stops` comes; after a group that could not be read,
    all of the rest is content."""
    if context.state == RAW:
        return read_raw(text, context)
    body = Body(text, context)
    position = 0
    while True:
        found, found_marker = content_until(text, position, (marker,), context)
        body.add_text(text[position:found])
        if found_marker is None:
            return body.parse(Open(found, CONTENT, Text, (marker,)))
        after = body.group(found, found + len(marker), read, CONTENT, stops)
        if isinstance(after, FamilyParse):
            return after
        position = after


def content_until(text: str, start: int, markers: Sequence[str], context: ParseContext) -> tuple[int, str | None]:
    """The first of `markers` from `start`: (where, which); where none, (the end of the text
    that is settled: less what may begin a marker, while the output grows, None)."""
    found, marker = first_found(text, markers, start)
    if marker is not None:
        return found, marker
    return (len(text) if context.final else len(text) - held_back(text[start:], markers)), None


# --- reasoning at the start ---------------------------------------------------------------------

def lead(text: str, context: ParseContext, blocks: Sequence[tuple[str, str]], settles: Sequence[str],
         bare_call: Callable[[str, int, bool], bool | None] | None = None,
         prompt_may_open: bool = True) -> tuple[FamilyParse, int | None]:
    """The reasoning an output of these formats starts with: (its parse, where the body starts;
    None while that is not known, or where the output ended in the reasoning).

    `blocks`: the reasoning blocks the output may open with; where the prompt opened one
    (reasoning_open) the output starts inside <think>. Where the model reasons but opened no
    block, its template may have opened <think> in the prompt: the text before the first
    </think> is then reasoning, and it waits until a </think>, one of `settles` (a call's
    marker) or the output's end says (`bare_call`: whether the text at the body's start begins
    a bare call, which settles it too; None while that is not known). `prompt_may_open`: False
    for a format whose templates never open the block in the prompt (Mistral's)."""
    state = context.state
    if state == REASONING or state is None and context.reasoning_open and context.reasons:
        return _inside(text, context, 0, THINK_CLOSE)
    if isinstance(state, tuple) and state[0] == REASONING:
        return _inside(text, context, 0, state[1])
    if state is not None:
        return FamilyParse(()), 0
    begins = skip_space(text, 0)
    for opener, closer in blocks:
        if text.startswith(opener, begins):
            return _inside(text, context, begins + len(opener), closer)
        if not context.final and opener.startswith(text[begins:]):
            return FamilyParse(()), None  # nothing yet, or the start of the opener: wait
    if not context.reasons or not prompt_may_open:
        return FamilyParse(()), 0
    if bare_call is not None:
        starts_call = bare_call(text, begins, context.final)
        if starts_call is None:
            return FamilyParse(()), None
        if starts_call:
            return FamilyParse(()), 0
    end, marker = first_found(text, (THINK_CLOSE, *settles))
    if marker == THINK_CLOSE:
        return FamilyParse((Thought(text[:end]),)), end + len(THINK_CLOSE)
    if marker is not None or context.final:
        return FamilyParse(()), 0
    return FamilyParse((), open=Open(0, None, None, (THINK_CLOSE, *settles))), None


def _inside(text: str, context: ParseContext, start: int, closer: str) -> tuple[FamilyParse, int | None]:
    """Reasoning from `start` to `closer`."""
    end = text.find(closer, start)
    if end >= 0:
        return FamilyParse((Thought(text[start:end]),)), end + len(closer)
    if context.final:
        return FamilyParse((Thought(text[start:]),)), None
    at = len(text) - held_back(text[start:], (closer,))
    state = REASONING if closer == THINK_CLOSE else (REASONING, closer)
    return FamilyParse((Thought(text[start:at]),), open=Open(at, state, Thought, (closer,))), None


def in_body(context: ParseContext) -> bool:
    """Whether a body read in this context is read from the middle of its content (not from
    the body's start, where a call may stand bare)."""
    return context.state in (CONTENT, RAW)
