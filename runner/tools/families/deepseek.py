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

As the output streams, a parse goes on from reasoning (family.REASONING) or content
(family.CONTENT) until a `</think>`, something that may open a call section, or the end of the
turn; a section that has not ended is read again from its opener when something that may end
one of its calls, or the section, comes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..family import (CONTENT, CUT_OFF, REASONING, STRICT_JSON, Call, CallSyntax, Family, FamilyParse, Open,
                      ParseContext, PartialCall, Segment, Text, Thought, arguments_json, held_back, property_schema,
                      read_turn, reread_pace, skip_space, string_value_partial, then, typed_value)
from ..partial_json import settled_prefix

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

# What may begin a call section (every DSML block's tag starts with <｜DSML｜): content and
# reasoning stream on until one of these comes (the end of the turn is read_turn's).
SECTION_STARTS = (CALLS_BEGIN, "<" + DSML)
REASONING_STOPS = (THINK_CLOSE, *SECTION_STARTS)
# What ends a call or a section that has not ended: until one comes, it stays so (a call is read
# whole only where its end marker is, and a section ends only at its closer). DSML's tags are
# matched with their spacing; they all end so: </｜DSML｜invoke>, <｜DSML｜invoke name="x"/>, and
# the block's </｜DSML｜tool_calls> (function_calls, calls).
MARKED_SECTION_STOPS = (CALL_END, CALLS_END)
DSML_SECTION_STOPS = ("invoke>", "/>", "calls>")


@dataclass
class _Section:
    """One call section read: its calls, where it ends (None: not yet, or never), and why it
    could not be read to its end (None: it could) from where (`failed_at`)."""

    calls: list[Call] = field(default_factory=list)
    end: int | None = None
    failure: str | None = None
    failed_at: int = 0
    partial: PartialCall | None = None  # the call being written, as far as it settled (its arguments stream)


def parse(text: str, context: ParseContext) -> FamilyParse:
    return read_turn(text, context, (END_OF_SENTENCE,), _parse_turn)


def _parse_turn(text: str, context: ParseContext) -> FamilyParse:
    reasoning, body = _reasoning(text, context)
    if body is None:
        return reasoning
    return then(reasoning, body, _read_answer(text[body:], context))


# --- reasoning ----------------------------------------------------------------------------------

def _reasoning(text: str, context: ParseContext) -> tuple[FamilyParse, int | None]:
    """The reasoning at the start: (its parse, where the answer starts; None while it goes on).

    Like family.leading_reasoning, but a call section (a pattern: DSML's tags have spacing)
    ends the block as `</think>` does, and stays in the answer."""
    if context.state == REASONING:  # read on from inside the block
        start = 0
    elif context.state is not None:  # the block is behind
        return FamilyParse(()), 0
    else:
        begins = skip_space(text, 0)
        if text.startswith(THINK_OPEN, begins):
            start = begins + len(THINK_OPEN)
        elif not context.final and THINK_OPEN.startswith(text[begins:]):
            return FamilyParse((), open=Open(0)), None  # nothing yet, or the start of <think>: wait
        elif context.reasoning_open:
            start = 0
        else:
            return FamilyParse(()), 0
    close = text.find(THINK_CLOSE, start)
    section = _SECTION_OPEN.search(text, start, close if close >= 0 else len(text))
    if section is not None:
        return FamilyParse((Thought(text[start:section.start()]),)), section.start()  # the section is the answer's
    if close >= 0:
        return FamilyParse((Thought(text[start:close]),)), close + len(THINK_CLOSE)
    if context.final:
        return FamilyParse((Thought(text[start:]),)), len(text)
    opened = _plain(text, start, REASONING, Thought, REASONING_STOPS)
    return FamilyParse((Thought(text[start:opened.at]),), open=opened), None


def _plain(text: str, start: int, state: str, grows: type[Text] | type[Thought], stops: tuple[str, ...]) -> Open:
    """Where plain content or reasoning from `start` goes on from: the end that may begin one
    of `stops` waits; so does a DSML block's opening tag not yet whole (`<｜DSML｜ tool_ca`,
    its spacing free), which no stop string can say: it is read again at every piece."""
    partial = _DSML_OPEN_SO_FAR.search(text, start)
    if partial and any(block.startswith(partial.group(1)) for block in _DSML_BLOCKS):
        return Open(partial.start(), state)
    return Open(len(text) - held_back(text[start:], stops), state, grows, stops)


# --- the answer: content and call sections ------------------------------------------------------

def _read_answer(text: str, context: ParseContext) -> FamilyParse:
    """Content and calls after the reasoning (the state CONTENT: read on from the middle of it)."""
    segments: list[Segment] = []
    error = None
    position = 0
    while True:
        opener = _SECTION_OPEN.search(text, position)
        if opener is None:
            if context.final:
                _add_text(segments, text[position:])
                return FamilyParse(tuple(segments), error)
            opened = _plain(text, position, CONTENT, Text, SECTION_STARTS)
            _add_text(segments, text[position:opened.at])
            return FamilyParse(tuple(segments), error, opened)
        _add_text(segments, text[position:opener.start()])
        marked = opener.group() == CALLS_BEGIN
        read = (_read_marked_section if marked else _read_dsml_section)(text, opener.end(), context)
        segments.extend(read.calls)
        if not context.final and (read.failure is not None or read.end is None):
            # A call not yet closed (or not readable, which only the end settles), or a section
            # whose closer has not come: the section is read again, from its opener, when
            # something that ends a call or the section comes.
            stops = MARKED_SECTION_STOPS if marked else DSML_SECTION_STOPS
            opened = Open(opener.start(), CONTENT, None, stops, len(read.calls), reread_after=reread_pace(read.partial))
            return FamilyParse((*segments, *([read.partial] if read.partial else [])), error, opened)
        if read.failure is not None:
            error = read.failure
            # A call cut off by the end of the output was a call: dropped, and the rest of its
            # section with it (half of the markup of a call that will not run). One that cannot
            # be read is the model's text, as it wrote it (the whole section where nothing of it
            # was a call).
            if read.failure != CUT_OFF:
                _add_text(segments, text[read.failed_at if read.calls else opener.start():read.end])
        if read.end is None:
            return FamilyParse(tuple(segments), error)
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
        if isinstance(read, PartialCall):
            section.partial, read = read, None
        if read is None:
            return _failed(section, text, position, _CALLS_END)
        call, position = read
        section.calls.append(call)


def _read_marked_call(text: str, start: int) -> tuple[Call, int] | PartialCall | None:
    """One call after <｜tool▁call▁begin｜>, and where it ends; None when it cannot be read (yet),
    or while its arguments' object is being written, the call as far as it settled."""
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
    except ValueError:  # not whole yet (or not JSON, which only the end settles)
        return PartialCall(name, settled_prefix(text[json_start:])) if text.startswith("{", json_start) else None
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
        if isinstance(read, PartialCall):
            section.partial, read = read, None
        if read is None:
            return _failed(section, text, position, _DSML_CLOSE)
        call, position = read
        section.calls.append(call)


def _read_invoke(text: str, invoke: re.Match[str], context: ParseContext) -> tuple[Call, int] | PartialCall | None:
    """One invoke and where it ends; None when it cannot be read (yet), or while a string
    parameter is written, the invoke as far as it settled."""
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
            return _partial_invoke(text, parameter, name, arguments, schema) if parameter else None
        key, is_string = parameter.group(1), parameter.group(2)
        arguments[key] = _parameter_value(text[parameter.end():end.start()], is_string,
                                          property_schema(schema, key))
        position = end.end()


def _partial_invoke(text: str, parameter: re.Match[str], name: str, arguments: dict, schema) -> PartialCall | None:
    """The invoke as far as it settled while a string parameter is written (string="true", or
    a string by its schema): its text so far, less an unfinished tag that may be its close."""
    key, is_string = parameter.group(1), parameter.group(2)
    if is_string == "false" or (is_string is None and property_schema(schema, key).get("type") != "string"):
        return None
    raw = text[parameter.end():]
    tag = raw.rfind("<")
    return string_value_partial(name, arguments, key, raw[:tag] if tag >= 0 and ">" not in raw[tag:] else raw)


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


def template_messages(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """DeepSeek V4's template writes the results that follow a turn of calls as one user block,
    in the order of the calls (llama.cpp's DeepSeek V3.2/V4 handler sorts them so)."""
    if not ("dsml_token" in source and DSML in source and "tool_calls" in source and "function_calls" not in source):
        return messages
    shaped = list(messages)
    order: dict[str, int] = {}
    index = 0
    while index < len(shaped):
        message = shaped[index]
        if message["role"] == "assistant" and message.get("tool_calls"):
            order = {call["id"]: number for number, call in enumerate(message["tool_calls"]) if call.get("id")}
            index += 1
            continue
        if message["role"] not in ("user", "tool"):
            index += 1
            continue
        end = index
        while end < len(shaped) and shaped[end]["role"] in ("user", "tool"):
            end += 1
        places = [place for place in range(index, end) if shaped[place]["role"] == "tool"]
        if len(places) > 1 and order:
            results = sorted((shaped[place] for place in places), key=lambda result: order.get(
                result.get("tool_call_id", ""), 0))
            for place, result in zip(places, results):
                shaped[place] = result
        index = end
    return shaped


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
    template_messages=template_messages,
)
