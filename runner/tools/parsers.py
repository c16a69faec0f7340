"""What a model wrote, read as it streams: content, reasoning and tool calls (ToolFormat's families).

One `ToolCallParser` per request with tools: the engine feeds it every piece of text the model
emits and gets back `Delta`s to stream; after `close()`, `result()` is the whole output parsed.
`parse_output` is the same parser fed the whole text at once, so a stream's deltas add up to
the whole-text parse by construction.

The parser is a generator-based reader: each step of the grammar (`_text_until`, `_scan_value`,
`_call_object`, ...) reads from one growing buffer and, where the text so far cannot decide
what comes next, yields to wait for more. A decision is taken only when the text already read
settles it (or the output has ended), so it cannot depend on where the pieces were cut.
`_StreamReader` holds the buffer and the reading primitives, `_TextOutput` the content and
reasoning streamed so far, `_Calls` the calls; `ToolCallParser` reads each format's grammar.

What is held back, never shown as content until known not to be a call: a suffix that may begin
a marker (`<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`, `</think>`), a leading `{` in the
JSON-led formats (LLAMA3, GENERIC), whitespace at the end of the content so far (whitespace at
the edges and between calls is dropped), and -- when reasoning is parsed and the output did not
open with `<think>` -- all text before the first `</think>` or call, since a template that puts
`<think>` in the generation prompt makes that text reasoning (the cost: a reply with neither
is released only when the output ends; pass `parse_reasoning=False` for models that never think).

Malformed calls never raise: the call is dropped, its raw text and everything after it become
content, and `ParsedOutput.error` says why. Deltas already streamed for the broken call
(its `ToolCallStart`, pieces of its arguments) cannot be taken back: a stream's client sees a
call the final result does not hold. JSON is validated by the standard library; only finding
where a value ends (strings, escapes, nesting) is scanned by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from .types import (ArgumentsDelta, Delta, ParsedOutput, ReasoningDelta, TextDelta, ToolCall, ToolCallStart,
                    ToolFormat)

T = TypeVar("T")
Steps = Generator[None, None, T]  # a reading step: yields while it waits for more text, returns its result

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"

NAME_KEY = "name"
ARGUMENTS_KEYS = ("arguments", "parameters")  # Llama 3 writes "parameters", the others "arguments"
GENERIC_CALLS_KEY = "tool_calls"
GENERIC_CALL_KEY = "tool_call"
GENERIC_RESPONSE_KEY = "response"
NO_ARGUMENTS = "{}"

JSON_WHITESPACE = " \t\n\r"
SCALAR_ENDS = JSON_WHITESPACE + ",:]}"  # what ends a number, true, false or null
FUNCTION_NAME_PUNCTUATION = "_-."

NOT_JSON = "the model's tool call is not valid JSON"
CUT_OFF = "the model's tool call was cut off before it ended"
NO_NAME = "the model's tool call names no function"
ARGUMENTS_NOT_OBJECT = "the model's tool call arguments are not a JSON object"
HERMES_UNCLOSED = f"the model's tool call is not closed by {HERMES_CLOSE}"
MISTRAL_NO_ARGS = f"the model's tool call has no {MISTRAL_ARGS} after the function name"
GENERIC_UNKNOWN = (f"the model's JSON output holds none of {GENERIC_CALLS_KEY!r}, {GENERIC_CALL_KEY!r} "
                   f"and {GENERIC_RESPONSE_KEY!r}")
RESPONSE_NOT_STRING = f"the model's {GENERIC_RESPONSE_KEY!r} is not a JSON string"

ERROR_EXCERPT_CHARS = 60  # of the malformed JSON, quoted in ParsedOutput.error

STRICT_JSON = json.JSONDecoder()
LENIENT_JSON = json.JSONDecoder(strict=False)  # content may hold raw newlines inside a string


class _Malformed(Exception):
    """Text that began a call is not one; `reason` is the sentence for ParsedOutput.error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _JsonValue:
    text: str  # as the model wrote it
    value: Any  # as json decodes it


@dataclass
class _CallInProgress:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None
    held_arguments: str = ""  # arguments written before the name, streamed once the name is known

    @property
    def is_started(self) -> bool:
        return self.name is not None


class _EdgeTrimmer:
    """Drops whitespace at the edges of a text stream: leading whitespace at once, trailing
    whitespace held until more text follows it (then released), dropped if nothing does."""

    def __init__(self) -> None:
        self._is_started = False
        self._pending = ""

    def push(self, text: str) -> str:
        """The text to emit now for `text`."""
        if not self._is_started:
            text = text.lstrip()
            if not text:
                return ""
            self._is_started = True
        body = text.rstrip()
        if not body:
            self._pending += text
            return ""
        released = self._pending + body
        self._pending = text[len(body):]
        return released

    def take_pending(self) -> str:
        """The whitespace held so far, forgotten here (a call follows it)."""
        pending, self._pending = self._pending, ""
        return pending


class _TextOutput:
    """The content and reasoning of one output, as they stream: edge whitespace trimmed, and text
    that a later </think> may still make reasoning (its <think> was in the prompt) held back."""

    def __init__(self, out: list[Delta]) -> None:
        self._out = out  # the parser's deltas not yet taken
        self._content_parts: list[str] = []
        self._reasoning_parts: list[str] = []
        self._content_trim = _EdgeTrimmer()
        self._reasoning_trim = _EdgeTrimmer()
        # Text read while a </think> may still make it reasoning (its <think> was in the prompt).
        self.may_be_reasoning = False
        self._held_parts: list[str] = []

    def content(self) -> str:
        return "".join(self._content_parts)

    def reasoning(self) -> str:
        return "".join(self._reasoning_parts)

    def emit_content(self, text: str) -> None:
        if self.may_be_reasoning:
            self._held_parts.append(text)
            return
        released = self._content_trim.push(text)
        if released:
            self._content_parts.append(released)
            self._out.append(TextDelta(released))

    def emit_reasoning(self, text: str) -> None:
        released = self._reasoning_trim.push(text)
        if released:
            self._reasoning_parts.append(released)
            self._out.append(ReasoningDelta(released))

    def end_prompt_opened_reasoning(self) -> None:
        """A </think> came: the text held for it is reasoning."""
        self.may_be_reasoning = False
        self.emit_reasoning(self._take_held_text())

    def settle_as_content(self) -> None:
        """No </think> came before a call or the end: the text held for it is content."""
        if self.may_be_reasoning:
            self.may_be_reasoning = False
            self.emit_content(self._take_held_text())

    def take_pending_whitespace(self) -> str:
        """The content's trailing whitespace held so far, forgotten here (a call follows it)."""
        return self._content_trim.take_pending()

    def _take_held_text(self) -> str:
        held = "".join(self._held_parts)
        self._held_parts = []
        return held


class _Calls:
    """The tool calls of one output: their starts and arguments streamed as deltas (arguments
    written before the name held until the name is known), and the whole ones kept."""

    def __init__(self, call_id: Callable[[int], str], out: list[Delta]) -> None:
        self._call_id = call_id
        self._out = out  # the parser's deltas not yet taken
        self._num_started = 0
        self.whole: list[ToolCall] = []

    def new_call(self) -> _CallInProgress:
        return _CallInProgress(index=self._num_started)

    def start(self, call: _CallInProgress, name: str) -> None:
        call.name = name
        call.id = self._call_id(call.index)
        self._num_started += 1
        self._out.append(ToolCallStart(call.index, call.id, name))
        if call.held_arguments:
            self._out.append(ArgumentsDelta(call.index, call.held_arguments))
            call.held_arguments = ""

    def emit_arguments(self, call: _CallInProgress, piece: str) -> None:
        if call.is_started:
            self._out.append(ArgumentsDelta(call.index, piece))
        else:
            call.held_arguments += piece

    def finish(self, call: _CallInProgress) -> None:
        """The call is whole: it joins the result (with "{}" for arguments it never wrote)."""
        if call.arguments is None:
            call.arguments = NO_ARGUMENTS
            self.emit_arguments(call, NO_ARGUMENTS)
        assert call.id is not None and call.name is not None
        self.whole.append(ToolCall(id=call.id, name=call.name, arguments=call.arguments))


class _StreamReader:
    """One growing buffer of output text, read by generator steps that yield while the text so
    far cannot settle what they read (see the module's docstring); the JSON and marker primitives."""

    def __init__(self) -> None:
        self._buf = ""
        self._pos = 0  # the first unread character of _buf
        self._is_closed = False

    def _text_until(self, markers: tuple[str, ...], sink: Callable[[str], None]) -> Steps[str | None]:
        """Hand text to `sink` up to the first of `markers` (consumed): the marker, or None at the
        end. Only a suffix that may begin a marker is held back."""
        while True:
            found_at, found = _find_first(self._buf, self._pos, markers)
            if found is not None:
                sink(self._buf[self._pos:found_at])
                self._pos = found_at + len(found)
                return found
            if self._is_closed:
                sink(self._buf[self._pos:])
                self._pos = len(self._buf)
                return None
            safe_end = len(self._buf) - _marker_prefix_length(self._buf, self._pos, markers)
            sink(self._buf[self._pos:safe_end])
            self._pos = safe_end
            # Text already handed on is never read again: keep the buffer to what is unread.
            self._buf = self._buf[self._pos:]
            self._pos = 0
            yield

    # --- reading primitives ------------------------------------------------------------------

    def _has_unread(self) -> Steps[bool]:
        """Wait for an unread character; False when the output ended first."""
        while self._pos >= len(self._buf):
            if self._is_closed:
                return False
            yield
        return True

    def _skip_whitespace(self, whitespace: str | None = None) -> Steps[str | None]:
        """Skip whitespace (any, or the characters of `whitespace`); the next character, left
        unread, or None at the end of the output."""
        while (yield from self._has_unread()):
            char = self._buf[self._pos]
            if not (char in whitespace if whitespace is not None else char.isspace()):
                return char
            self._pos += 1
        return None

    def _skip_json_whitespace(self) -> Steps[str | None]:
        return (yield from self._skip_whitespace(JSON_WHITESPACE))

    def _consume_literal(self, literal: str) -> Steps[bool]:
        """Consume `literal` if the output goes on with it; False, consuming nothing, once it cannot."""
        while True:
            unread = self._buf[self._pos:self._pos + len(literal)]
            if unread == literal:
                self._pos += len(literal)
                return True
            if not literal.startswith(unread) or self._is_closed:
                return False
            yield

    def _is_at_end_inside(self, literal: str) -> bool:
        """Whether the output ended with (at most) a beginning of `literal` left unread."""
        return self._is_closed and literal.startswith(self._buf[self._pos:])

    def _expect(self, char: str, what: str) -> Steps[None]:
        found = yield from self._skip_json_whitespace()
        if found is None:
            raise _Malformed(CUT_OFF)
        if found != char:
            raise _Malformed(f"{NOT_JSON}: expected {what}, found {found!r}")
        self._pos += 1

    def _next_key(self, is_first: bool) -> Steps[str | None]:
        """The next key of an object being read (its ':' consumed), or None at its '}'."""
        found = yield from self._skip_json_whitespace()
        if found == "}":
            self._pos += 1
            return None
        if not is_first:
            if found != ",":
                raise _Malformed(CUT_OFF if found is None else f"{NOT_JSON}: expected ',' or '}}', found {found!r}")
            self._pos += 1
            found = yield from self._skip_json_whitespace()
        if found != '"':
            raise _Malformed(CUT_OFF if found is None else f"{NOT_JSON}: expected a key in double quotes, "
                                                            f"found {found!r}")
        key = (yield from self._scan_value()).value
        yield from self._expect(":", "':' after a key")
        return key

    def _scan_value(self, on_piece: Callable[[str], None] | None = None) -> Steps[_JsonValue]:
        """Read one JSON value whole, tracking strings, escapes and nesting to find its end;
        `on_piece` gets its text as it arrives. json validates it once it is whole."""
        first = yield from self._skip_json_whitespace()
        if first is None:
            raise _Malformed(CUT_OFF)
        start = scanned = handed = self._pos
        is_scalar = first not in '{["'
        depth = 0
        is_in_string = is_escaped = False
        end = None
        while end is None:
            buf = self._buf
            while scanned < len(buf):
                char = buf[scanned]
                if is_in_string:
                    if is_escaped:
                        is_escaped = False
                    elif char == "\\":
                        is_escaped = True
                    elif char == '"':
                        is_in_string = False
                        if depth == 0:
                            end = scanned + 1
                            break
                elif is_scalar:
                    if char in SCALAR_ENDS:
                        end = scanned
                        break
                elif char == '"':
                    is_in_string = True
                elif char in "{[":
                    depth += 1
                elif char in "}]":
                    depth -= 1
                    if depth == 0:
                        end = scanned + 1
                        break
                scanned += 1
            if end is None and is_scalar and self._is_closed:
                end = scanned
            ready = end if end is not None else scanned
            if on_piece is not None and ready > handed:
                on_piece(buf[handed:ready])
                handed = ready
            if end is None:
                if self._is_closed:
                    raise _Malformed(CUT_OFF)
                yield
        self._pos = end
        text = self._buf[start:end]
        return _JsonValue(text, _decode(text, STRICT_JSON))

    def _stream_string(self, sink: Callable[[str], None]) -> Steps[None]:
        """Read a JSON string, handing `sink` its decoded text as it arrives (GENERIC's response)."""
        first = yield from self._skip_json_whitespace()
        if first is None:
            raise _Malformed(CUT_OFF)
        if first != '"':
            raise _Malformed(RESPONSE_NOT_STRING)
        scanned = decoded = self._pos + 1
        is_escaped = False
        end = None
        while end is None:
            buf = self._buf
            while scanned < len(buf):
                char = buf[scanned]
                if is_escaped:
                    is_escaped = False
                elif char == "\\":
                    is_escaped = True
                elif char == '"':
                    end = scanned
                    break
                scanned += 1
            ready = end if end is not None else _whole_escapes_end(buf, decoded, scanned)
            if ready > decoded:
                sink(_decode(f'"{buf[decoded:ready]}"', LENIENT_JSON))
                decoded = ready
            if end is None:
                if self._is_closed:
                    raise _Malformed(CUT_OFF)
                yield
        self._pos = end + 1


class ToolCallParser(_StreamReader):
    """Streams one output's content, reasoning and tool calls (see the module's docstring)."""

    def __init__(self, tool_format: ToolFormat, call_id: Callable[[int], str],
                 parse_reasoning: bool = True) -> None:
        self._format = ToolFormat(tool_format)
        super().__init__()
        self._parse_reasoning = parse_reasoning
        self._is_done = False
        self._out: list[Delta] = []
        self._text = _TextOutput(self._out)
        self._calls = _Calls(call_id, self._out)
        self._raw_start = 0  # where the raw text of a broken call begins
        self._error: str | None = None
        self._steps = self._read_output()

    # --- the public interface ---------------------------------------------------------------

    def feed(self, text: str) -> list[Delta]:
        """Read the next piece of the output; the deltas it settles (maybe none)."""
        if self._is_closed:
            raise ValueError("feed() after close(): the output has ended")
        self._buf += text
        self._resume()
        return self._take_deltas()

    def close(self) -> list[Delta]:
        """The output ended: settle and return what was held back. Calling it again does nothing."""
        if not self._is_closed:
            self._is_closed = True
            self._resume()
        return self._take_deltas()

    def result(self) -> ParsedOutput:
        """The whole output, parsed: what the deltas add up to, less any broken call."""
        if not self._is_closed:
            raise ValueError("result() before close(): the output may go on")
        return ParsedOutput(content=self._text.content() or None, reasoning=self._text.reasoning() or None,
                            tool_calls=tuple(self._calls.whole), error=self._error)

    # --- driving the reading steps ------------------------------------------------------------

    def _resume(self) -> None:
        if self._is_done:
            return
        try:
            next(self._steps)
        except StopIteration:
            self._is_done = True

    def _take_deltas(self) -> list[Delta]:
        deltas = list(self._out)
        self._out.clear()  # the list _TextOutput appends to too
        return deltas

    def _read_output(self) -> Steps[None]:
        if self._parse_reasoning:
            first = yield from self._skip_whitespace()
            if first is not None and (yield from self._consume_literal(THINK_OPEN)):
                if (yield from self._text_until((THINK_CLOSE,), self._text.emit_reasoning)) is None:
                    return  # ended inside the think block: all of it was reasoning
            else:
                self._text.may_be_reasoning = True
        if self._format is ToolFormat.HERMES:
            yield from self._marked_calls_body(HERMES_OPEN, self._hermes_block)
        elif self._format is ToolFormat.MISTRAL:
            yield from self._marked_calls_body(MISTRAL_CALLS, self._mistral_calls)
        elif self._format is ToolFormat.LLAMA3:
            yield from self._json_led_body(self._llama3_calls)
        else:
            yield from self._json_led_body(self._generic_object)

    # --- the bodies of the formats ----------------------------------------------------------

    def _marked_calls_body(self, marker: str, read_calls: Callable[[], Steps[None]]) -> Steps[None]:
        """Text, with calls wherever `marker` appears (HERMES, MISTRAL)."""
        while (yield from self._content_until(marker)) is not None:
            if not (yield from self._guarded(read_calls, self._pos - len(marker))):
                return

    def _json_led_body(self, read_calls: Callable[[], Steps[None]]) -> Steps[None]:
        """Calls when the output starts with `{` (or, in LLAMA3, <|python_tag|>); else text (LLAMA3, GENERIC)."""
        while True:
            first = yield from self._skip_whitespace()
            start = self._pos  # a broken call's raw text keeps its <|python_tag|>
            is_call = first == "{" or (self._format is ToolFormat.LLAMA3 and first is not None
                                       and (yield from self._consume_literal(PYTHON_TAG)))
            if is_call:
                self._text.settle_as_content()
                if (yield from self._guarded(read_calls, start)):
                    yield from self._text_until((), self._text.emit_content)  # what follows the calls
                return
            if (yield from self._content_until()) is None:
                return
            # A </think> ended reasoning whose <think> was in the prompt: the rest may start with a call.

    def _content_until(self, *call_markers: str) -> Steps[str | None]:
        """Read content up to the first of `call_markers`: the marker, or None at the end. While
        the text may still be reasoning opened by the prompt, a </think> ends it instead and
        this returns THINK_CLOSE."""
        markers = call_markers + ((THINK_CLOSE,) if self._text.may_be_reasoning else ())
        found = yield from self._text_until(markers, self._text.emit_content)
        if found == THINK_CLOSE:
            self._text.end_prompt_opened_reasoning()
            if call_markers:
                return (yield from self._content_until(*call_markers))
            return found
        self._text.settle_as_content()
        return found

    def _guarded(self, read_calls: Callable[[], Steps[None]], start: int) -> Steps[bool]:
        """Read calls starting at `start`; whether they were whole. If not, their raw text and
        everything after it is content, and the error says why."""
        whitespace_before = self._text.take_pending_whitespace()
        self._raw_start = start
        try:
            yield from read_calls()
            return True
        except _Malformed as problem:
            self._error = self._error or problem.reason
            before = whitespace_before if self._raw_start == start else ""
            self._text.emit_content(before + self._buf[self._raw_start:self._pos])
            yield from self._text_until((), self._text.emit_content)
            return False

    # --- the calls of each format -----------------------------------------------------------

    def _hermes_block(self) -> Steps[None]:
        """After <tool_call>: one call object, then </tool_call> (or the end of the output)."""
        call = yield from self._call_object()
        yield from self._skip_whitespace()
        # The closing tag may be missing or cut short when the output ends right after a whole call.
        if not (yield from self._consume_literal(HERMES_CLOSE)):
            if not self._is_at_end_inside(HERMES_CLOSE):
                raise _Malformed(HERMES_UNCLOSED)
            self._pos = len(self._buf)
        self._commit(call)

    def _mistral_calls(self) -> Steps[None]:
        """After [TOOL_CALLS]: a JSON array of call objects, or `name[ARGS]{...}`."""
        first = yield from self._skip_json_whitespace()
        if first == "[":
            yield from self._call_array()
        else:
            self._commit((yield from self._named_call()))

    def _llama3_calls(self) -> Steps[None]:
        """Call objects separated by `;` or whitespace; what follows the last one is content."""
        while True:
            self._commit((yield from self._call_object()))
            following = yield from self._skip_whitespace()
            if following == ";":
                self._pos += 1
                following = yield from self._skip_whitespace()
            if following != "{":
                return

    def _generic_object(self) -> Steps[None]:
        """{"tool_calls": [...]}, {"tool_call": {...}} or {"response": "text"}."""
        yield from self._expect("{", "'{'")
        is_known = False
        is_first = True
        while (key := (yield from self._next_key(is_first))) is not None:
            is_first = False
            if key == GENERIC_CALLS_KEY:
                yield from self._call_array()
            elif key == GENERIC_CALL_KEY:
                self._commit((yield from self._call_object()))
            elif key == GENERIC_RESPONSE_KEY:
                yield from self._stream_string(self._text.emit_content)
                self._raw_start = self._pos  # the response is content already: keep it out of the raw text
            else:
                yield from self._scan_value()
                continue
            is_known = True
        if not is_known:
            raise _Malformed(GENERIC_UNKNOWN)

    def _call_array(self) -> Steps[None]:
        yield from self._expect("[", "'['")
        if (yield from self._skip_json_whitespace()) == "]":
            self._pos += 1
            return
        while True:
            self._commit((yield from self._call_object()))
            following = yield from self._skip_json_whitespace()
            if following is None:
                raise _Malformed(CUT_OFF)
            self._pos += 1
            if following == "]":
                return
            if following != ",":
                raise _Malformed(f"{NOT_JSON}: expected ',' or ']' after a call, found {following!r}")

    def _call_object(self) -> Steps[_CallInProgress]:
        """One {"name": ..., "arguments": {...}} object (other keys are skipped), its start and
        arguments streamed as they are read."""
        yield from self._expect("{", "'{' to begin the call")
        call = self._calls.new_call()
        is_first = True
        while (key := (yield from self._next_key(is_first))) is not None:
            is_first = False
            if key == NAME_KEY and call.name is None:
                name = (yield from self._scan_value()).value
                if not isinstance(name, str) or not name:
                    raise _Malformed(NO_NAME)
                self._calls.start(call, name)
            elif key in ARGUMENTS_KEYS and call.arguments is None:
                call.arguments = yield from self._arguments(call)
            else:
                yield from self._scan_value()
        if call.name is None:
            raise _Malformed(NO_NAME)
        return call

    def _named_call(self) -> Steps[_CallInProgress]:
        """Mistral's newer `name[ARGS]{...}`."""
        start = self._pos
        while True:
            if not (yield from self._has_unread()):
                raise _Malformed(CUT_OFF)
            char = self._buf[self._pos]
            if not (char.isalnum() or char in FUNCTION_NAME_PUNCTUATION):
                break
            self._pos += 1
        name = self._buf[start:self._pos]
        if not (yield from self._consume_literal(MISTRAL_ARGS)):
            raise _Malformed(CUT_OFF if self._is_at_end_inside(MISTRAL_ARGS) else MISTRAL_NO_ARGS)
        if not name:
            raise _Malformed(NO_NAME)
        call = self._calls.new_call()
        self._calls.start(call, name)
        call.arguments = yield from self._arguments(call)
        return call

    def _arguments(self, call: _CallInProgress) -> Steps[str]:
        """The arguments' JSON text: an object streamed as written, or a string holding one unwrapped."""
        first = yield from self._skip_json_whitespace()
        if first == "{":
            return (yield from self._scan_value(lambda piece: self._calls.emit_arguments(call, piece))).text
        if first == '"':
            arguments = _unwrap_arguments((yield from self._scan_value()).value)
            self._calls.emit_arguments(call, arguments)
            return arguments
        if first is None:
            raise _Malformed(CUT_OFF)
        raise _Malformed(ARGUMENTS_NOT_OBJECT)

    def _commit(self, call: _CallInProgress) -> None:
        """The call is whole: it joins the result, and a later broken call's raw text starts after it."""
        self._calls.finish(call)
        self._raw_start = self._pos


def parse_output(tool_format: ToolFormat, text: str, call_id: Callable[[int], str],
                 parse_reasoning: bool = True) -> ParsedOutput:
    """The stream parser fed the whole text at once, closed."""
    parser = ToolCallParser(tool_format, call_id, parse_reasoning)
    parser.feed(text)
    parser.close()
    return parser.result()


# --- helpers -----------------------------------------------------------------------------------

def _decode(text: str, decoder: json.JSONDecoder) -> Any:
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as problem:
        raise _Malformed(f"{NOT_JSON}: {problem.msg} in {_excerpt(text)}") from None


def _excerpt(text: str) -> str:
    """The text, shortened for an error sentence."""
    if len(text) <= ERROR_EXCERPT_CHARS:
        return text
    return text[:ERROR_EXCERPT_CHARS] + "..."


def _unwrap_arguments(value: Any) -> str:
    """Arguments written as a string that holds an object's JSON: that JSON text."""
    if not isinstance(value, str):
        raise _Malformed(ARGUMENTS_NOT_OBJECT)
    inner = value.strip()
    try:
        is_object = isinstance(STRICT_JSON.decode(inner), dict)
    except json.JSONDecodeError:
        is_object = False
    if not is_object:
        raise _Malformed(ARGUMENTS_NOT_OBJECT)
    return inner


def _find_first(text: str, start: int, markers: tuple[str, ...]) -> tuple[int, str | None]:
    """Where the earliest of `markers` occurs in text[start:], and which (-1, None if none)."""
    best_at, best = -1, None
    for marker in markers:
        at = text.find(marker, start)
        if at != -1 and (best is None or at < best_at):
            best_at, best = at, marker
    return best_at, best


def _marker_prefix_length(text: str, start: int, markers: tuple[str, ...]) -> int:
    """The length of the longest end of text[start:] that begins one of `markers`."""
    longest = min(max((len(marker) for marker in markers), default=0) - 1, len(text) - start)
    for length in range(longest, 0, -1):
        tail = text[len(text) - length:]
        if any(marker.startswith(tail) for marker in markers):
            return length
    return 0


def _whole_escapes_end(text: str, start: int, stop: int) -> int:
    """The last position in text[start:stop] (a JSON string's inside) that cuts no escape and no
    surrogate pair written as two \\u escapes, so the text before it decodes on its own."""
    safe = position = start
    while position < stop:
        if text[position] != "\\":
            position += 1
            safe = position
            continue
        if position + 1 >= stop:
            break
        length = 6 if text[position + 1] == "u" else 2
        if position + length > stop:
            break
        if length == 6 and _is_high_surrogate_escape(text[position:position + length]):
            if position + 2 * length > stop:
                break
            length *= 2
        position += length
        safe = position
    return safe


def _is_high_surrogate_escape(escape: str) -> bool:
    try:
        return 0xD800 <= int(escape[2:], 16) <= 0xDBFF
    except ValueError:
        return False
