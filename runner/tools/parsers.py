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
a marker (`<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`, `</think>`), a leading `{` (LLAMA3,
GENERIC) or `[name(` (LLAMA3: Llama 4's pythonic calls) at the start of the output, whitespace at
the end of the content so far (whitespace at the edges and between calls is dropped), and --
when reasoning is parsed and the output did not open with `<think>` -- all text before the
first `</think>` or call, since a template that puts `<think>` in the generation prompt makes
that text reasoning (the cost: a reply with neither is released only when the output ends; pass
`parse_reasoning=False` for models that never think, `reasoning_open=True` when the prompt is
known to have opened the block). MISTRAL reads `[THINK]...[/THINK]` at the start as reasoning.

A call is streamed only once whole (its `ToolCallStart` and all its arguments at once): one
streamed while written could not be taken back if the output were then cut off or malformed.
Malformed calls never raise: the call is dropped, its raw text and everything after it become
content, and `ParsedOutput.error` says why -- except a call cut off by the end of the output
after whole calls, or with nothing after its opening marker, which is dropped without becoming
content (the calls stand; a bare marker is no text). JSON is validated by the standard library;
only finding where a value ends (strings, escapes, nesting) is scanned by hand.
"""

from __future__ import annotations

import ast
import json
import re
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
PYTHON_START = "<|python_start|>"  # Llama 4 (its calls may also be written bare)
PYTHON_END = "<|python_end|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"
MISTRAL_THINK_OPEN = "[THINK]"
MISTRAL_THINK_CLOSE = "[/THINK]"
CALL_OPENERS = (HERMES_OPEN, MISTRAL_CALLS, PYTHON_TAG, PYTHON_START)

# Llama 4's pythonic calls: `[name(` begins them, and a text that may still grow into that waits.
PYTHONIC_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
PYTHONIC_START_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")

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
NOT_PYTHONIC = "the model's tool calls are not a Python list of calls with literal keyword arguments"
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
    name: str | None = None
    arguments: str | None = None


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
    """The tool calls of one output, streamed only once whole: a call's start and its arguments
    go out together when the model has finished writing it. (A call streamed while written
    could not be taken back when the output is then cut off or turns out malformed: the client
    would run a call the model never finished.)"""

    def __init__(self, call_id: Callable[[int], str], out: list[Delta]) -> None:
        self._call_id = call_id
        self._out = out  # the parser's deltas not yet taken
        self.whole: list[ToolCall] = []

    def finish(self, call: _CallInProgress) -> None:
        """The call is whole: it joins the result (with "{}" for arguments it never wrote)."""
        assert call.name is not None
        index = len(self.whole)
        arguments = call.arguments if call.arguments is not None else NO_ARGUMENTS
        self.whole.append(ToolCall(id=self._call_id(index), name=call.name, arguments=arguments))
        self._out += [ToolCallStart(index, self.whole[-1].id, call.name), ArgumentsDelta(index, arguments)]


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

    def _scan_value(self) -> Steps[_JsonValue]:
        """Read one JSON value whole, tracking strings, escapes and nesting to find its end;
        json validates it once it is whole."""
        first = yield from self._skip_json_whitespace()
        if first is None:
            raise _Malformed(CUT_OFF)
        start = scanned = self._pos
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
    """Streams one output's content, reasoning and tool calls (see the module's docstring).

    `parse_reasoning`: the model may reason in <think>...</think> (and a template may have opened
    the block in the prompt: text before a </think> waits). `reasoning_open`: the prompt did open
    it, so the output starts as reasoning (all of it when no </think> comes)."""

    def __init__(self, tool_format: ToolFormat, call_id: Callable[[int], str],
                 parse_reasoning: bool = True, reasoning_open: bool = False) -> None:
        self._format = ToolFormat(tool_format)
        super().__init__()
        self._parse_reasoning = parse_reasoning
        self._reasoning_open = reasoning_open
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
        """The whole output, parsed: what the deltas add up to."""
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
        if not (yield from self._leading_reasoning()):
            return  # ended inside the reasoning block: all of it was reasoning
        if self._format is ToolFormat.HERMES:
            yield from self._marked_calls_body(HERMES_OPEN, self._hermes_block)
        elif self._format is ToolFormat.MISTRAL:
            yield from self._marked_calls_body(MISTRAL_CALLS, self._mistral_calls)
        elif self._format is ToolFormat.LLAMA3:
            yield from self._llama3_body()
        else:
            yield from self._json_led_body(self._generic_object)

    def _leading_reasoning(self) -> Steps[bool]:
        """The reasoning block the output starts with, if any; False when the output ended in it."""
        if self._reasoning_open:
            return (yield from self._text_until((THINK_CLOSE,), self._text.emit_reasoning)) is not None
        blocks = self._reasoning_blocks()
        if blocks and (yield from self._skip_whitespace()) is not None:
            for opener, closer in blocks:
                if (yield from self._consume_literal(opener)):
                    return (yield from self._text_until((closer,), self._text.emit_reasoning)) is not None
        # Mistral's templates never open [THINK] for the model: its text is content from the start.
        self._text.may_be_reasoning = self._parse_reasoning and self._format is not ToolFormat.MISTRAL
        return True

    def _reasoning_blocks(self) -> tuple[tuple[str, str], ...]:
        """The reasoning delimiters an output of this format may start with."""
        blocks = ((THINK_OPEN, THINK_CLOSE),) if self._parse_reasoning else ()
        if self._format is ToolFormat.MISTRAL:
            # [THINK] is a control token (Magistral, Ministral 3 Reasoning): never text, always
            # reasoning; Magistral 2506 wrote <think> as text.
            blocks = ((MISTRAL_THINK_OPEN, MISTRAL_THINK_CLOSE), *blocks)
        return blocks

    # --- the bodies of the formats ----------------------------------------------------------

    def _marked_calls_body(self, marker: str, read_calls: Callable[[], Steps[None]]) -> Steps[None]:
        """Text, with calls wherever `marker` appears (HERMES, MISTRAL)."""
        while (yield from self._content_until(marker)) is not None:
            if not (yield from self._guarded(read_calls, self._pos - len(marker))):
                return

    def _json_led_body(self, read_calls: Callable[[], Steps[None]]) -> Steps[None]:
        """Calls when the output starts with `{`; else text (GENERIC)."""
        while True:
            first = yield from self._skip_whitespace()
            if first == "{":
                self._text.settle_as_content()
                if (yield from self._guarded(read_calls, self._pos)):
                    yield from self._text_until((), self._text.emit_content)  # what follows the calls
                return
            if (yield from self._content_until()) is None:
                return
            # A </think> ended reasoning whose <think> was in the prompt: the rest may start with a call.

    def _llama3_body(self) -> Steps[None]:
        """Llama 3's JSON calls and Llama 4's pythonic ones: led by <|python_tag|> or
        <|python_start|> anywhere, or written bare at the start (`{"name": ...}`, `[name(...)]`)."""
        at_start = True
        while True:
            if at_start:
                first = yield from self._skip_whitespace()
                start = self._pos
                read_calls = None
                if first == "{":
                    read_calls = self._llama3_calls
                elif first == "[" and (yield from self._begins_pythonic_calls()):
                    read_calls = self._pythonic_calls
                if read_calls is not None:
                    self._text.settle_as_content()
                    if not (yield from self._guarded(read_calls, start)):
                        return
                at_start = False
            markers = (PYTHON_TAG, PYTHON_START) + ((THINK_CLOSE,) if self._text.may_be_reasoning else ())
            found = yield from self._text_until(markers, self._text.emit_content)
            if found == THINK_CLOSE:  # reasoning opened by the prompt ended: the rest may start with a call
                self._text.end_prompt_opened_reasoning()
                at_start = True
                continue
            self._text.settle_as_content()
            if found is None:
                return
            read_calls = self._llama3_calls if found == PYTHON_TAG else self._python_start_calls
            if not (yield from self._guarded(read_calls, self._pos - len(found))):
                return

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
        """Read calls starting at `start`; whether they were whole. A call cut off by the end of
        the output (max_tokens) is dropped: it was a call, not text, and its markers must never
        reach the content. A call that cannot be read is content, its raw text and everything
        after it. Either way the error says why."""
        whitespace_before = self._text.take_pending_whitespace()
        self._raw_start = start
        try:
            yield from read_calls()
            return True
        except _Malformed as problem:
            self._error = self._error or problem.reason
            if problem.reason == CUT_OFF:
                self._pos = len(self._buf)
                return False
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
        """After [TOOL_CALLS]: a JSON array of call objects, or `name[CALL_ID]id[ARGS]{...}`."""
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

    def _python_start_calls(self) -> Steps[None]:
        """After Llama 4's <|python_start|>: its calls (pythonic, or JSON), then <|python_end|>."""
        first = yield from self._skip_whitespace()
        if first == "[":
            yield from self._pythonic_calls()
        else:
            yield from self._llama3_calls()
        yield from self._skip_whitespace()
        if not (yield from self._consume_literal(PYTHON_END)) and self._is_at_end_inside(PYTHON_END):
            self._pos = len(self._buf)

    def _begins_pythonic_calls(self) -> Steps[bool]:
        """Whether the `[` at the read position begins Llama 4's `[name(`; waits until the text
        settles it, and consumes nothing (a `[` that begins no call is content)."""
        while not PYTHONIC_START.match(self._buf, self._pos):
            if self._is_closed or not PYTHONIC_START_PREFIX.fullmatch(self._buf, self._pos):
                return False
            yield
        return True

    def _pythonic_calls(self) -> Steps[None]:
        """Llama 4's `[name(key=value, ...), ...]`, the values Python literals: read whole, then
        every call in it (made only when the whole list reads)."""
        text = yield from self._scan_python_list()
        for name, arguments in _pythonic_call_list(text):
            self._commit(_CallInProgress(name, arguments))

    def _scan_python_list(self) -> Steps[str]:
        """The text of the Python list at the read position (tracking strings, escapes and
        nesting to find its end)."""
        start = scanned = self._pos
        depth = 0
        quote = None
        is_escaped = False
        while True:
            while scanned < len(self._buf):
                char = self._buf[scanned]
                scanned += 1
                if quote is not None:
                    if is_escaped:
                        is_escaped = False
                    elif char == "\\":
                        is_escaped = True
                    elif char == quote:
                        quote = None
                elif char in "'\"":
                    quote = char
                elif char in "([{":
                    depth += 1
                elif char in ")]}":
                    depth -= 1
                    if depth == 0:
                        self._pos = scanned
                        return self._buf[start:scanned]
            if self._is_closed:
                raise _Malformed(CUT_OFF)
            yield

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
        """One {"name": ..., "arguments": {...}} object (other keys are skipped)."""
        yield from self._expect("{", "'{' to begin the call")
        call = _CallInProgress()
        is_first = True
        while (key := (yield from self._next_key(is_first))) is not None:
            is_first = False
            if key == NAME_KEY and call.name is None:
                name = (yield from self._scan_value()).value
                if not isinstance(name, str) or not name:
                    raise _Malformed(NO_NAME)
                call.name = name
            elif key in ARGUMENTS_KEYS and call.arguments is None:
                call.arguments = yield from self._arguments()
            else:
                yield from self._scan_value()
        if call.name is None:
            raise _Malformed(NO_NAME)
        return call

    def _named_call(self) -> Steps[_CallInProgress]:
        """Mistral's newer `name[ARGS]{...}`, with `[CALL_ID]id` before [ARGS] where the model
        writes its call's id (Mistral Small 3.2)."""
        name = yield from self._word(FUNCTION_NAME_PUNCTUATION)
        if (yield from self._consume_literal(MISTRAL_CALL_ID)):
            yield from self._word("")  # the call's id: ours are the server's
        if not (yield from self._consume_literal(MISTRAL_ARGS)):
            raise _Malformed(CUT_OFF if self._is_at_end_inside(MISTRAL_ARGS) else MISTRAL_NO_ARGS)
        if not name:
            raise _Malformed(NO_NAME)
        return _CallInProgress(name, (yield from self._arguments()))

    def _word(self, punctuation: str) -> Steps[str]:
        """Letters, digits and `punctuation` from the read position (consumed)."""
        start = self._pos
        while True:
            if not (yield from self._has_unread()):
                raise _Malformed(CUT_OFF)
            char = self._buf[self._pos]
            if not (char.isalnum() or char in punctuation):
                return self._buf[start:self._pos]
            self._pos += 1

    def _arguments(self) -> Steps[str]:
        """The arguments' JSON text: an object as written, or a string holding one unwrapped."""
        first = yield from self._skip_json_whitespace()
        if first == "{":
            return (yield from self._scan_value()).text
        if first == '"':
            return _unwrap_arguments((yield from self._scan_value()).value)
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


def _pythonic_call_list(text: str) -> list[tuple[str, str]]:
    """Llama 4's `[name(key=value, ...), ...]` as (name, arguments JSON text) pairs; the values
    are Python literals (strings in either quote, True, None, dicts, lists)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _Malformed(NOT_PYTHONIC) from None
    if not isinstance(tree, ast.List):
        raise _Malformed(NOT_PYTHONIC)
    calls = []
    for node in tree.elts:
        name = _dotted_name(node.func) if isinstance(node, ast.Call) else None
        if name is None or node.args or any(keyword.arg is None for keyword in node.keywords):
            raise _Malformed(NOT_PYTHONIC)
        try:
            arguments = {keyword.arg: _json_value(ast.literal_eval(keyword.value)) for keyword in node.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise _Malformed(NOT_PYTHONIC) from None
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted_name(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _json_value(value: Any) -> Any:
    """A Python literal as the JSON value it stands for (tuples are arrays); ValueError where
    JSON has none (sets, bytes, complex numbers, NaN, keys that are not strings)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_value(item) for key, item in value.items()}
    raise ValueError(f"{type(value).__name__} is not JSON")


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
