"""DeepSeek V3 / R1, V3.1, V3.2, V4 and V4.1: three ways to write calls, reasoning in <think>.

V3 and R1 (and R1's distills): the call's type before the separator, the name after it, and
the arguments as a fenced JSON block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1: the name before the separator, bare JSON after it:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.2, V4 and V4.1: DSML markup. The block is `function_calls` (V3.2), `tool_calls` (V4) or
`calls` (V4.1, which also writes a space after the ｜DSML｜ token); `string="true"` parameters
are raw text (no escaping, whitespace kept), `string="false"` ones JSON:

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

Reasoning is <think>...</think>. V3.1 and later templates end the generation prompt with
`<think>` in thinking mode (the output starts as reasoning and holds only `</think>`) and with
`</think>` (or `<think></think>`) otherwise; R1's always open it. A call section also ends the
reasoning (llama.cpp's reading too: a model may call without closing its thinking).

The text itself says which form a call has (a V3.1 call has JSON right after the separator,
a DSML section is its own markup), so the parse needs no variant: it reads every form whatever
`context.variant` says ("deepseek-v3" ... "deepseek-v41", the names of `variants` below).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..family import (CUT_OFF, STRICT_JSON, Call, CallSyntax, Family, FamilyParse, ParseContext, Segment, Text,
                      Thought, arguments_json, held_back, property_schema, skip_space, typed_value, until_turn_end)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
SEPARATOR = "<｜tool▁sep｜>"
DSML = "｜DSML｜"
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"  # the stop token: the turn ends there
UNREADABLE = "the model's tool call could not be read"

_DSML_BLOCKS = ("function_calls", "tool_calls", "calls")
_BLOCK = "(?:" + "|".join(_DSML_BLOCKS) + ")"
_DSML_OPEN = re.compile(rf"<{DSML}\s*{_BLOCK}>")
_DSML_CLOSE = re.compile(rf"</{DSML}\s*{_BLOCK}>")
_DSML_OPEN_SO_FAR = re.compile(rf"<{DSML}\s*([a-z_]*)$")  # a block's opening tag, not yet whole
_INVOKE_OPEN = re.compile(rf'<{DSML}\s*invoke\s+name="([^"]*)"\s*(/?)>')
_INVOKE_CLOSE = re.compile(rf"</{DSML}\s*invoke>")
_PARAMETER_OPEN = re.compile(rf'<{DSML}\s*parameter\s+name="([^"]*)"(?:\s+string="(true|false)")?\s*>')
_PARAMETER_CLOSE = re.compile(rf"</{DSML}\s*parameter>")
_SECTION_OPEN = re.compile(re.escape(CALLS_BEGIN) + "|" + _DSML_OPEN.pattern)
_FENCE = re.compile(r"```(?:json)?")

# What may begin a call section or end the turn: text ending with the start of one waits.
_OPENER_STARTS = (CALLS_BEGIN, "<" + DSML, END_OF_SENTENCE)


@dataclass
class _Section:
    """One call section read: its calls, where it ends (None: not yet, or never), and why it
    could not be read to its end (None: it could) from where (`failed_at`)."""

    calls: list[Call] = field(default_factory=list)
    end: int | None = None
    failure: str | None = None
    failed_at: int = 0


def parse(text: str, context: ParseContext) -> FamilyParse:
    text, context = until_turn_end(text, context, (END_OF_SENTENCE,))
    segments, rest = _split_reasoning(text, context)
    if rest is None:
        return FamilyParse(tuple(segments))
    error = _read_answer(rest, context, segments)
    return FamilyParse(tuple(segments), error)


# --- reasoning ----------------------------------------------------------------------------------

def _split_reasoning(text: str, context: ParseContext) -> tuple[list[Segment], str | None]:
    """The reasoning at the start (segments) and the text after it (None while it goes on).

    Like family.split_reasoning, but a call section ends the block as `</think>` does."""
    stripped = text.lstrip()
    inside = context.reasoning_open
    if stripped.startswith(THINK_OPEN):
        inside, text = True, stripped[len(THINK_OPEN):]
    elif not context.final and THINK_OPEN.startswith(stripped):
        return [], None  # nothing yet, or the start of <think>: wait
    if not inside:
        return [], text
    close = text.find(THINK_CLOSE)
    section = _SECTION_OPEN.search(text)
    if section is not None and (close < 0 or section.start() < close):
        return [Thought(text[:section.start()])], text[section.start():]  # the section is the answer's
    if close >= 0:
        return [Thought(text[:close])], text[close + len(THINK_CLOSE):]
    if context.final:
        return [Thought(text)], ""
    return [Thought(text[:_may_begin_marker(text, (THINK_CLOSE, *_OPENER_STARTS))])], None


def _may_begin_marker(text: str, markers: tuple[str, ...]) -> int:
    """Where the end of `text` that may begin a marker (or a DSML block's opening tag) starts."""
    cut = len(text) - held_back(text, markers)
    partial = _DSML_OPEN_SO_FAR.search(text)
    if partial and any(block.startswith(partial.group(1)) for block in _DSML_BLOCKS):
        cut = min(cut, partial.start())
    return cut


# --- the answer: content and call sections ------------------------------------------------------

def _read_answer(text: str, context: ParseContext, segments: list[Segment]) -> str | None:
    """Content and calls after the reasoning, onto `segments`; the error, if any."""
    error = None
    position = 0
    while True:
        opener = _SECTION_OPEN.search(text, position)
        if opener is None:
            tail = text[position:]
            _add_text(segments, tail if context.final else tail[:_may_begin_marker(tail, _OPENER_STARTS)])
            return error
        _add_text(segments, text[position:opener.start()])
        read = (_read_marked_section if opener.group() == CALLS_BEGIN else _read_dsml_section)(text, opener.end(),
                                                                                           context)
        segments.extend(read.calls)
        if read.failure is not None and not context.final:
            return error  # a call not yet closed (or not readable, which only the end settles): wait
        if read.failure is not None:
            error = read.failure
            if not read.calls:  # nothing of it was a call: the model's text, as it wrote it
                _add_text(segments, text[opener.start():read.end])
            elif read.failure != CUT_OFF:  # a call that cannot be read: its text, as it was written
                _add_text(segments, text[read.failed_at:read.end])
            # A section cut off after its first calls: the rest is left out (the corpus expects
            # that too), half of the markup of a call that will not run.
        if read.end is None:
            return error
        position = read.end


def _add_text(segments: list[Segment], text: str) -> None:
    if text:
        segments.append(Text(text))


def _failed(section: _Section, text: str, position: int, closer: re.Pattern[str]) -> _Section:
    """A section that could not be read from `position`: it ends at the next closing tag (a
    call that could not be read) or never (a call cut off)."""
    section.failed_at = position
    close = closer.search(text, position)
    if close is None:
        # Calls complete and only the closing tag missing: the section is read.
        section.failure = CUT_OFF if text[position:].strip() or not section.calls else None
        return section
    section.end, section.failure = close.end(), UNREADABLE
    return section


# --- V3 / R1 and V3.1: <｜tool▁calls▁begin｜> ----------------------------------------------------

_CALLS_END = re.compile(re.escape(CALLS_END))


def _read_marked_section(text: str, start: int, context: ParseContext) -> _Section:
    section = _Section()
    position = start
    while True:
        position = skip_space(text, position)
        if text.startswith(CALLS_END, position):
            section.end = position + len(CALLS_END)
            return section
        read = _read_marked_call(text, position + len(CALL_BEGIN)) if text.startswith(CALL_BEGIN, position) else None
        if read is None:
            return _failed(section, text, position, _CALLS_END)
        call, position = read
        section.calls.append(call)


def _read_marked_call(text: str, start: int) -> tuple[Call, int] | None:
    """One call after <｜tool▁call▁begin｜>, and where it ends; None when it cannot be read (yet)."""
    separator = text.find(SEPARATOR, start)
    if separator < 0:
        return None
    head, body = text[start:separator], separator + len(SEPARATOR)
    json_start = skip_space(text, body)
    fenced = not text.startswith("{", json_start)
    if fenced:  # V3 / R1: `function<｜tool▁sep｜>NAME\n```json\n{...}\n```
        line_end = text.find("\n", body)
        if line_end < 0:
            return None
        name = text[body:line_end].strip()
        json_start = skip_space(text, line_end)
        fence = _FENCE.match(text, json_start)
        json_start = skip_space(text, fence.end()) if fence else json_start
    else:  # V3.1: `NAME<｜tool▁sep｜>{...}`
        name = head.strip()
    if not _is_name(name):
        return None
    try:
        arguments, end = STRICT_JSON.raw_decode(text, json_start)
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    end = skip_space(text, end)
    if fenced and text.startswith("```", end):
        end = skip_space(text, end + 3)
    if not text.startswith(CALL_END, end):
        return None
    return Call(name, arguments_json(arguments)), end + len(CALL_END)


def _is_name(name: str) -> bool:
    return bool(name) and not any(character.isspace() for character in name) and "｜" not in name


# --- V3.2, V4, V4.1: DSML -----------------------------------------------------------------------

def _read_dsml_section(text: str, start: int, context: ParseContext) -> _Section:
    section = _Section()
    position = start
    while True:
        position = skip_space(text, position)
        close = _DSML_CLOSE.match(text, position)
        if close:
            section.end = close.end()
            return section
        invoke = _INVOKE_OPEN.match(text, position)
        read = _read_invoke(text, invoke, context) if invoke else None
        if read is None:
            return _failed(section, text, position, _DSML_CLOSE)
        call, position = read
        section.calls.append(call)


def _read_invoke(text: str, invoke: re.Match[str], context: ParseContext) -> tuple[Call, int] | None:
    """One invoke and where it ends; None when it cannot be read (yet)."""
    name, self_closing = invoke.group(1), invoke.group(2)
    if not _is_name(name):
        return None
    if self_closing:  # <｜DSML｜invoke name="x"/>: SGLang reports V4 writing this for no arguments
        return Call(name, "{}"), invoke.end()
    schema = context.schema_of(name)
    arguments: dict[str, Any] = {}
    position = invoke.end()
    while True:
        position = skip_space(text, position)
        close = _INVOKE_CLOSE.match(text, position)
        if close:
            return Call(name, arguments_json(arguments)), close.end()
        parameter = _PARAMETER_OPEN.match(text, position)
        end = _PARAMETER_CLOSE.search(text, parameter.end()) if parameter else None
        if end is None:
            return None
        key, is_string = parameter.group(1), parameter.group(2)
        arguments[key] = _parameter_value(text[parameter.end():end.start()], is_string,
                                          property_schema(schema, key))
        position = end.end()


def _parameter_value(raw: str, is_string: str | None, schema: Any) -> Any:
    """string="true": the text as written; string="false": JSON (text where it is not JSON);
    no attribute: as the parameter's schema says."""
    if is_string == "true":
        return raw
    if is_string == "false":
        try:
            return STRICT_JSON.decode(raw.strip())
        except ValueError:
            pass
    return typed_value(raw, schema)


FAMILY = Family(
    name="deepseek",
    description="DeepSeek V3/R1 (<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME + ```json), V3.1 "
                "(NAME<｜tool▁sep｜>{...}), V3.2/V4/V4.1 (<｜DSML｜invoke> markup); reasoning in <think>",
    parse=parse,
    fingerprints=((CALLS_BEGIN, SEPARATOR), (DSML, "invoke name=")),
    markers=(CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEPARATOR, DSML, THINK_OPEN, THINK_CLOSE,
             END_OF_SENTENCE, "<｜Assistant｜>", "<｜User｜>"),
    reasoning=(THINK_OPEN, THINK_CLOSE),
    priority=40,
    # Sub-formats, as the corpus names them (the parse reads all of them whichever is given).
    # First match wins: R1's and V3's templates fence the JSON, V3.1's does not; V3.2's block is
    # function_calls, V4's (and V4.1's) tool_calls.
    variants={
        "deepseek-v3": (CALLS_BEGIN, SEPARATOR, "```json"),
        "deepseek-v31": (CALLS_BEGIN, SEPARATOR),
        "deepseek-v32": (DSML, "function_calls"),
        "deepseek-v4": (DSML, "tool_calls"),
    },
    # Constrained calls, as each sub-format's template writes them back into the history.
    call_syntax=CallSyntax(block_open=CALLS_BEGIN, call_open=CALL_BEGIN + "{name}" + SEPARATOR, call_close=CALL_END,
                           block_close=CALLS_END),
    variant_call_syntax={
        "deepseek-v3": CallSyntax(block_open=CALLS_BEGIN, call_open=CALL_BEGIN + "function" + SEPARATOR + "{name}\n```json\n",
                                  call_close="\n```" + CALL_END, separator="\n", block_close=CALLS_END),
        "deepseek-v32": CallSyntax(block_open=f"<{DSML}function_calls>\n", call_open=f'<{DSML}invoke name="{{name}}">\n',
                                   call_close=f"</{DSML}invoke>\n", block_close=f"</{DSML}function_calls>",
                                   parameter_open=f'<{DSML}parameter name="{{key}}" string="{{string}}">',
                                   parameter_close=f"</{DSML}parameter>\n"),
        "deepseek-v4": CallSyntax(block_open=f"<{DSML}tool_calls>\n", call_open=f'<{DSML}invoke name="{{name}}">\n',
                                  call_close=f"</{DSML}invoke>\n", block_close=f"</{DSML}tool_calls>",
                                  parameter_open=f'<{DSML}parameter name="{{key}}" string="{{string}}">',
                                  parameter_close=f"</{DSML}parameter>\n"),
    },
)
