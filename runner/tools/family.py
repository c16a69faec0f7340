"""What a model family's output format is, and the streaming reader every family shares.

A family (one file under runner/tools/families/) says how to recognise its chat template, the
markers its model writes, where its reasoning is, and how to read a whole output: `parse(text,
context)` turns the text written so far into `Segment`s: content (`Text`), reasoning
(`Thought`) and complete calls (`Call`). A family's parse is a plain function of the text; the
streaming, the whitespace at the edges, the ids of the calls and the result are the same for
every family (`OutputParser`).

The rule a parse keeps: while the output may still grow (`context.final` False) it returns only
what more text cannot change. Text that may be the start of a marker, a call not yet closed, a
reasoning block whose end is unknown: held back (left out of the segments) until the text that
follows settles them. The segments of a longer text then begin with those of a shorter one
(the last Text or Thought may have grown), so a stream's deltas add up to the parse of the whole
text, wherever the pieces were cut. At the end (`final` True) everything is settled: a call
that was never closed, or that cannot be read, is given back as content with `error` saying why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .types import ArgumentsDelta, Delta, ParsedOutput, ReasoningDelta, TextDelta, Tool, ToolCall, ToolCallStart

CUT_OFF = "the model's tool call was cut off before it ended"


@dataclass(frozen=True)
class Text:
    """Content: text meant for the user."""

    text: str


@dataclass(frozen=True)
class Thought:
    """Reasoning: text the model wrote before answering."""

    text: str


@dataclass(frozen=True)
class Call:
    """A complete call: the function's name and its arguments as JSON text of an object."""

    name: str
    arguments: str


Segment = Text | Thought | Call


@dataclass(frozen=True)
class ParseContext:
    """What a family's parse knows besides the text."""

    final: bool = True  # the output has ended: settle everything
    tools: Mapping[str, Tool] = field(default_factory=dict)  # the offered functions, by name
    # The prompt ended inside a reasoning block (a template that writes <think> for the model):
    # the output starts as reasoning.
    reasoning_open: bool = False
    variant: str | None = None  # a family's sub-format, where it has several (DeepSeek's)

    def schema_of(self, name: str) -> Mapping[str, Any]:
        """The JSON schema of a function's arguments (an empty object's when not offered)."""
        tool = self.tools.get(name)
        return tool.schema if tool is not None else {}


@dataclass(frozen=True)
class FamilyParse:
    segments: tuple[Segment, ...]
    error: str | None = None  # why text that began a call is content (only when it is)


ParseFunction = Callable[[str, ParseContext], FamilyParse]


@dataclass(frozen=True)
class CallSyntax:
    """How a family writes calls whose arguments are one JSON object: the text around them, for
    the grammar that constrains calls (runner/tools/grammars.py's family_grammar). `call_open`
    holds {name}, the function's name, and may hold {index}, a number the model writes (Kimi's
    call ids). Markers that are control tokens of the model's vocabulary are required as those
    tokens; other text as text."""

    call_open: str
    call_close: str
    block_open: str = ""  # before the first call
    block_close: str = ""  # after the last call
    separator: str = ""  # between two calls
    # The reasoning block as the grammar writes it, where it differs from the family's
    # `reasoning` (gpt-oss: a new message's start follows the analysis channel's end).
    reasoning: tuple[str, str] | None = None
    # Whether `auto` is constrained (free text until the trigger, then calls). False where the
    # family's text is framed by control tokens of its own (gpt-oss's channels), which free text
    # in a grammar cannot hold: `auto` then leaves the output free.
    constrains_auto: bool = True
    # Arguments as one block per parameter instead of one JSON object (Qwen3-Coder's
    # <parameter=KEY>\nVALUE\n</parameter>, GLM's <arg_key>KEY</arg_key><arg_value>...):
    # `parameter_open` holds {key}, and may hold {string} ("true" for a value written as raw
    # text, "false" for JSON: DeepSeek's DSML); string values are raw text, others JSON.
    # `parameter_close` may hold {key} too (MiniMax M3 closes a parameter with its name).
    parameter_open: str | None = None
    parameter_close: str = ""


@dataclass(frozen=True)
class Family:
    """One model family's format: recognition, markers, reasoning, and its parse."""

    name: str
    description: str
    parse: ParseFunction
    # Detection: a template is this family's when it holds every string of one of the tuples
    # (exact fingerprints, most specific first). Checked in registry order (`priority`, then name).
    fingerprints: tuple[tuple[str, ...], ...] = ()
    markers: tuple[str, ...] = ()  # strings that never reach content, reasoning or arguments
    reasoning: tuple[str, str] | None = None  # the reasoning block's open and close markers
    priority: int = 50  # lower: checked first (more specific families before the ones they contain)
    variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # sub-format: strings in its template
    # The formats multiseq's first streaming parser reads (hermes, llama3, mistral, generic):
    # their grammars and prompt renderings are that parser's (runner/tools/grammars.py's first
    # part, prompts.py).
    legacy_format: str | None = None
    call_syntax: CallSyntax | None = None  # how calls are written, for their grammar (None: no grammar)
    # The length of the alphanumeric call ids the family's templates insist on (Mistral's: 9);
    # None: any id. The server's ids are made so, and a client's are renamed for the template.
    call_id_length: int | None = None
    variant_call_syntax: Mapping[str, CallSyntax] = field(default_factory=dict)  # by sub-format, where it differs

    def matches(self, template: str) -> bool:
        return any(all(part in template for part in fingerprint) for fingerprint in self.fingerprints)

    def syntax_for(self, variant: str | None) -> CallSyntax | None:
        """The call syntax of a sub-format (the family's own where it has none of its own)."""
        return self.variant_call_syntax.get(variant, self.call_syntax) if variant else self.call_syntax

    def variant_of(self, template: str | None) -> str | None:
        if not template:
            return None
        return next((name for name, parts in self.variants.items() if all(part in template for part in parts)), None)

    def opens_reasoning(self, prompt: str) -> bool:
        """Whether a prompt ends inside this family's reasoning block (its template wrote the
        open marker for the model and nothing has closed it)."""
        if self.reasoning is None:
            return False
        opener, closer = self.reasoning
        start = prompt.rfind(opener)
        return start >= 0 and closer not in prompt[start:] and not prompt[start + len(opener):].strip()


def legacy_parse(tool_format: str) -> ParseFunction:
    """A parse for a family read by the first streaming parser (whole texts only: the engine
    streams through that parser itself, see `new_parser`)."""
    def parse(text: str, context: ParseContext) -> FamilyParse:
        from .parsers import parse_output  # the module imports this one's types
        parsed = parse_output(tool_format, text, lambda index: "", parse_reasoning=context.reasoning_open
                              or text.lstrip().startswith("<think>"))
        segments: list[Segment] = [Thought(parsed.reasoning)] if parsed.reasoning else []
        segments += [Call(call.name, call.arguments) for call in parsed.tool_calls]
        if parsed.content:
            segments.append(Text(parsed.content))
        return FamilyParse(tuple(segments), parsed.error)
    return parse


def new_parser(family: Family, call_id: Callable[[int], str], context: ParseContext, reasons: bool | None = None):
    """The streaming parser of one output in the family's format (feed, close, result).
    `reasons`: whether the first parser looks for reasoning (None: where the family has it; the
    engine says, from the model's template: Qwen3 reasons, Qwen 2.5 does not)."""
    if family.legacy_format is not None:
        from .parsers import ToolCallParser
        thinks = family.reasoning is not None if reasons is None else reasons
        return ToolCallParser(family.legacy_format, call_id, parse_reasoning=thinks,
                              reasoning_open=thinks and context.reasoning_open)
    return OutputParser(family, call_id, context)


class OutputParser:
    """A family's parse, fed as the text streams: deltas out, and at the end the whole result.

    The same interface as ToolCallParser: feed(text) -> deltas, close() -> deltas, result().
    Every feed parses the whole text so far; outputs are short enough (a parse of a 16 kB
    output is well under a millisecond for the regular-expression families) and it keeps each
    family's parse a plain function of the text."""

    def __init__(self, family: Family, call_id: Callable[[int], str], context: ParseContext) -> None:
        self.family = family
        self._call_id = call_id
        self._context = context
        self._text_parts: list[str] = []
        self._content = ""  # streamed so far
        self._reasoning = ""
        self._calls: list[ToolCall] = []
        self._error: str | None = None
        self._closed = False

    def feed(self, text: str) -> list[Delta]:
        if not text:
            return []
        self._text_parts.append(text)
        return self._advance(final=False)

    def close(self) -> list[Delta]:
        if self._closed:
            return []
        self._closed = True
        return self._advance(final=True)

    def result(self) -> ParsedOutput:
        return ParsedOutput(content=self._content or None, reasoning=self._reasoning or None,
                            tool_calls=tuple(self._calls), error=self._error)

    def _advance(self, final: bool) -> list[Delta]:
        text = "".join(self._text_parts)
        self._text_parts = [text]
        context = ParseContext(final=final, tools=self._context.tools, reasoning_open=self._context.reasoning_open,
                               variant=self._context.variant)
        parsed = self.family.parse(text, context)
        self._error = parsed.error
        segments = parsed.segments
        if final and parsed.error == CUT_OFF:
            segments = self._without_cut_off_call(segments)
        content, reasoning, calls = _joined(segments)
        deltas: list[Delta] = []
        reasoning = _settled(reasoning, final)
        if len(reasoning) > len(self._reasoning) and reasoning.startswith(self._reasoning):
            deltas.append(ReasoningDelta(reasoning[len(self._reasoning):]))
            self._reasoning = reasoning
        content = _settled(content, final)
        if len(content) > len(self._content) and content.startswith(self._content):
            deltas.append(TextDelta(content[len(self._content):]))
            self._content = content
        for call in calls[len(self._calls):]:
            index = len(self._calls)
            self._calls.append(ToolCall(self._call_id(index), call.name, call.arguments))
            deltas += [ToolCallStart(index, self._calls[-1].id, call.name), ArgumentsDelta(index, call.arguments)]
        return deltas


    def _without_cut_off_call(self, segments: Sequence[Segment]) -> Sequence[Segment]:
        """A call cut off by the end of the output (max_tokens) was a call, not text: its raw
        text (the last segment, holding the family's markers) never reaches the content; the
        error says it was cut off."""
        if segments and isinstance(segments[-1], Text) and any(
                marker in segments[-1].text for marker in self.family.markers):
            return segments[:-1]
        return segments


def _joined(segments: Sequence[Segment]) -> tuple[str, str, list[Call]]:
    content = "".join(segment.text for segment in segments if isinstance(segment, Text))
    reasoning = "".join(segment.text for segment in segments if isinstance(segment, Thought))
    return content, reasoning, [segment for segment in segments if isinstance(segment, Call)]


def _settled(text: str, final: bool) -> str:
    """Text without its edges' whitespace; while the output grows, whitespace at its end may
    be followed by more text or by nothing, so it waits."""
    text = text.lstrip()
    return text.rstrip() if final else text[:len(text.rstrip())]


# --- helpers the families share ------------------------------------------------------------------

def held_back(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of `text` may be the start of one of `markers` (they wait
    for more text before they can be shown)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def settled_text(text: str, context: ParseContext, markers: Sequence[str]) -> str:
    """`text` less what may begin a marker, while the output grows."""
    return text if context.final else text[:len(text) - held_back(text, markers)]


def split_reasoning(text: str, context: ParseContext, opener: str, closer: str,
                    markers: Sequence[str] = ()) -> tuple[list[Segment], str | None]:
    """Reasoning at the start of an output: (the reasoning segments, the text after its end).

    The block is open when the prompt opened it or the output starts with `opener` (after
    whitespace). The text after it is None while its end has not come (the reasoning so far is
    in the segments, less what may begin `closer`). `markers`: markers of calls that may also
    end an unclosed block (some models call without closing their thinking)."""
    stripped = text.lstrip()
    inside = context.reasoning_open
    if stripped.startswith(opener):
        inside, text = True, stripped[len(opener):]
    elif not stripped and not context.final:
        return [], None  # may still open: wait
    elif not inside and not context.final and opener.startswith(stripped):
        return [], None
    if not inside:
        return [], text
    end = text.find(closer)
    if end >= 0:
        return [Thought(text[:end])], text[end + len(closer):]
    return [Thought(settled_text(text, context, (closer, *markers)))], ("" if context.final else None)


def until_turn_end(text: str, context: ParseContext, end_tokens: Sequence[str]) -> tuple[str, ParseContext]:
    """The text up to the first of `end_tokens` (the family's end of turn) where the model wrote
    one: the output has ended there, so the context becomes final."""
    ends = [index for index in (text.find(token) for token in end_tokens) if index >= 0]
    if not ends:
        return text, context
    return text[:min(ends)], ParseContext(final=True, tools=context.tools, reasoning_open=context.reasoning_open,
                                          variant=context.variant)


def arguments_json(value: Any) -> str:
    """Arguments as the JSON text of an object, the way the APIs hand them out."""
    return json.dumps(value, ensure_ascii=False)


def typed_value(raw: str, schema: Mapping[str, Any]) -> Any:
    """A parameter written as plain text (XML-like formats), as the JSON value its schema asks
    for: strings stay text; numbers, booleans, null, objects and arrays are read as JSON where
    they parse, and stay text where they do not."""
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types} if types else set()
    if types and types <= {"string"}:
        return raw
    try:
        value = json.loads(raw, parse_constant=no_json_constant)
    except ValueError:
        return raw
    if not types or _matches_type(value, types):
        return value
    return raw


def _matches_type(value: Any, types: set[str]) -> bool:
    checks = {"string": lambda v: isinstance(v, str), "null": lambda v: v is None,
              "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list)}
    return any(checks.get(kind, lambda v: False)(value) for kind in types)


def property_schema(schema: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    properties = schema.get("properties")
    return properties.get(key, {}) if isinstance(properties, dict) else {}


def json_object_text(raw: str) -> str | None:
    """`raw` when it is the JSON text of an object (as the model wrote it), else None."""
    try:
        value = json.loads(raw, parse_constant=no_json_constant)
    except ValueError:
        return None
    return raw.strip() if isinstance(value, dict) else None


def no_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: clients' parsers refuse them


# JSON as clients read it: NaN and Infinity refused (the standard library takes them).
STRICT_JSON = json.JSONDecoder(parse_constant=no_json_constant)


def skip_space(text: str, position: int) -> int:
    """The position of the first character from `position` that is not whitespace."""
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def may_begin(text: str, position: int, markers: Sequence[str]) -> bool:
    """Whether the rest of the text from `position` may still grow into one of `markers`."""
    return any(marker.startswith(text[position:]) for marker in markers)


def nonempty(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """The segments without empty texts."""
    return tuple(segment for segment in segments if not isinstance(segment, Text) or segment.text)
