"""What a model family's output format is, and the streaming reader every family shares.

A family (one file under multiseq.tools.families) says how to recognise its chat template, the
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
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .stops import stops_of
from .types import Tool

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


@dataclass(frozen=True)
class PartialCall:
    """A call whose end has not come, as far as it is written: its name, and the start of its
    arguments as they will read once it ends (a prefix of the Call's arguments, always). Only
    the last segment of a parse while the output grows; the reader streams the arguments."""

    name: str
    arguments: str


Segment = Text | Thought | Call | PartialCall


@dataclass(frozen=True)
class ParseContext:
    """What a family's parse knows besides the text."""

    final: bool = True  # the output has ended: settle everything
    tools: Mapping[str, Tool] = field(default_factory=dict)  # the offered functions, by name
    # The prompt ended inside a reasoning block (a template that writes <think> for the model):
    # the output starts as reasoning.
    reasoning_open: bool = False
    variant: str | None = None  # a family's sub-format, where it has several (DeepSeek's)
    # Where the text given starts: None at the output's start; else a state the family's own
    # parse returned in an `Open` (the reader reads a stream on from there).
    state: Hashable = None
    # Whether the model may reason at all (the template says: Qwen3 does, Qwen 2.5 does not),
    # for the families whose reasoning depends on the model (hermes, llama3, generic).
    reasons: bool = True

    def schema_of(self, name: str) -> Mapping[str, Any]:
        """The JSON schema of a function's arguments (an empty object's when not offered)."""
        tool = self.tools.get(name)
        return tool.schema if tool is not None else {}


# The states most families resume in: plain content, plain reasoning (its opener read), both
# in the middle of the output (not at its start, where an opener or a bare call may stand).
CONTENT = "content"
REASONING = "reasoning"


@dataclass(frozen=True)
class Open:
    """What a parse of a growing output left open: the two claims the reader goes on from
    (multiseq.tools.reader), made by the family about its own format.

    Resume: the segments came from the text before `at`, and the text from `at` reads (with
    `state` as the context's state) into the segments that follow them, whatever comes after;
    its last error, where it has one, is the whole text's.

    `repeats`: how many of the last segments came from the text after `at` (the calls of a
    block that has not closed, read as they close): the parse from `at` gives them again.

    Stops (when not None): text appended after the text parsed, as long as no stop appears in
    the text from `at` that was not there before, changes nothing but `grows`: with Text or
    Thought, it is more content or reasoning (less an end that may begin a stop); with None,
    no segment comes of it (a call whose end has not come).

    `reread_after` (with stops): the text is read again once that many characters came without
    a stop, all the same: a call whose arguments stream (the claim holds but for the arguments
    of its PartialCall, which grow), read at that pace instead of at every piece."""

    at: int
    state: Hashable = None
    grows: type[Text] | type[Thought] | None = None
    stops: tuple[str, ...] | None = None
    repeats: int = 0
    reread_after: int = 0


def string_value_partial(name: str, settled: dict, key: str, text: str) -> PartialCall:
    """A call whose string parameter `key` is being written (parameter-block formats): the JSON
    of the values before it, then of its text so far; json.dumps escapes a character at a time,
    so this is a prefix of arguments_json's text of the whole call."""
    before = arguments_json(settled)[:-1] + (", " if settled else "")
    return PartialCall(name, before + arguments_json(key) + ": " + arguments_json(text)[:-1])


def reread_pace(partial: PartialCall | None) -> int:
    """How many characters a streaming call's arguments grow by between two reads: a tenth of
    a token's worth at first, then a fiftieth of what is written (a 20,000-character argument is
    read about 50 times over, not 5,000), at most 512."""
    return 16 if partial is None else min(512, max(32, len(partial.arguments) // 50))


@dataclass(frozen=True)
class FamilyParse:
    segments: tuple[Segment, ...]
    error: str | None = None  # why text that began a call is content (only when it is)
    open: Open | None = None  # while the output grows: where its reader goes on from (None: from the start)


ParseFunction = Callable[[str, ParseContext], FamilyParse]


@dataclass(frozen=True)
class CallSyntax:
    """How a family writes calls whose arguments are one JSON object: the text around them, for
    the grammar that constrains calls (multiseq.tools.grammars's family_grammar). `call_open`
    holds {name}, the function's name, and may hold {index}, a number the model writes (Kimi's
    call ids). Markers that are control tokens of the model's vocabulary are required as those
    tokens; other text as text."""

    call_open: str
    call_close: str
    block_open: str = ""  # before the first call
    block_close: str = ""  # after the last call
    separator: str = ""  # between two calls
    # Where free text ends and the calls begin in `auto`, where that is not the block's opening
    # or the call's up to the name: a prefix of it (Hermes' <tool_call>, Mistral's [TOOL_CALLS]).
    trigger: str = ""
    # Calls only at the output's start (Llama 3's bare object, the generic format's): `auto` is
    # text that does not begin as the calls do, or the calls.
    leads: bool = False
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
    # `parameter_open` may hold {type}: the value's JSON type as Kimi K3's template names it
    # (string, number for integers too, boolean, null, object, array), one alternative per type
    # the parameter's schema allows.
    parameter_open: str | None = None
    parameter_close: str = ""
    # Between two parameters written (LFM2's ", "): none before the first one written, one
    # before every later one, whichever optional parameters are left out.
    parameter_separator: str = ""
    # Every value as JSON, strings too (LFM2's Python-style keyword arguments: JSON's strings,
    # numbers, objects and arrays are Python literals, its true/false/null read as such).
    values_as_json: bool = False
    # Values in an object notation whose strings are raw text between this marker (Gemma 4's
    # <|"|>): numbers, booleans and null as JSON, objects {key:value,...} with bare keys (a key
    # a bare one cannot hold between the marker) and arrays [value,...], no spaces.
    string_quote: str = ""
    sorts_keys: bool = False  # parameters and object keys in the order of their names (a template's dictsort)
    # Replacements in a name or key written inside an attribute or a string (Kimi K3's
    # `key="..."`: & and "; a JSON string's \\ and ").
    attribute_escapes: tuple[tuple[str, str], ...] = ()
    # Regexes a function's name and a parameter's key must match to be written (LFM2's Python
    # identifiers); where one does not, the calls are written in `fallback` (LFM2: the JSON form
    # its reader also takes), or not constrained where there is none.
    name_pattern: str | None = None
    key_pattern: str | None = None
    fallback: CallSyntax | None = None
    # Where the output's content is an element the calls follow (Kimi K3's response): a forced
    # call may come after content (none at all too) closed by this.
    content_close: str = ""


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
    # The formats whose calls and tools multiseq can write into a prompt as text (hermes, llama3,
    # mistral, generic: prompts.py), for a template that knows no tools or --tool-format.
    legacy_format: str | None = None
    call_syntax: CallSyntax | None = None  # how calls are written, for their grammar (None: no grammar)
    # The length of the alphanumeric call ids the family's templates insist on (Mistral's: 9);
    # None: any id. The server's ids are made so, and a client's are renamed for the template.
    call_id_length: int | None = None
    variant_call_syntax: Mapping[str, CallSyntax] = field(default_factory=dict)  # by sub-format, where it differs
    # Whether content keeps the whitespace that comes right before a call ("Sure. " then a call:
    # "Sure. " or "Sure."); the JSON-call formats drop it, the others keep the text as written.
    keeps_space_before_calls: bool = True
    # The family's own shaping of the messages its template is rendered with, after the common
    # one (llama.cpp's handler for the family does the same: gpt-oss's reasoning as "thinking"):
    # a function of the messages and the template's text, which it may leave as they are.
    template_messages: Callable[[list[dict[str, Any]], str], list[dict[str, Any]]] | None = None
    # What the family's handler adds to a rendered prompt (Gemma 4's model turn after a call).
    finish_prompt: Callable[[str], str] | None = None
    keeps_developer_role: bool = False  # the template has a developer role of its own (gpt-oss)
    # The template reads the tools as the system message's `tools`, a JSON text of the functions
    # (Phi-4-mini), not as the template's `tools`.
    tools_in_system: bool = False

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


# --- helpers the families share ------------------------------------------------------------------

def held_back(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of `text` may be the start of one of `markers` (they wait
    for more text before they can be shown)."""
    return stops_of(tuple(marker for marker in markers if marker)).held(text)


def settled_text(text: str, context: ParseContext, markers: Sequence[str]) -> str:
    """`text` less what may begin a marker, while the output grows."""
    return text if context.final else text[:len(text) - held_back(text, markers)]


def then(first: FamilyParse, offset: int, second: FamilyParse) -> FamilyParse:
    """`first`'s segments, then `second`'s, which were read from the text at `offset` on (its
    Open is moved there); the error is the last one."""
    opened = second.open
    if opened is not None and offset:
        opened = replace(opened, at=opened.at + offset)
    return FamilyParse(first.segments + second.segments, second.error or first.error, opened)


def leading_reasoning(text: str, context: ParseContext, opener: str, closers: Sequence[str],
                      also_ending: Sequence[str] = (), held: Sequence[str] = ()) -> tuple[FamilyParse, int | None]:
    """A reasoning block at the start of the output: (its parse, where the text after it starts;
    None while the block has not ended).

    The block is open when the prompt opened it or the output starts with `opener` (after
    whitespace); any of `closers` ends it (and is dropped); any of `also_ending` ends it too but
    stays in the text after it (a model that starts its answer or its call without closing its
    thinking); text that may begin one of `held` waits too. In the state REASONING the text is
    inside the block from its first character; in any state but None (the output's start and
    REASONING), the block is behind: all of the text is after it."""
    if context.state == REASONING:
        start = 0
    elif context.state is not None:
        return FamilyParse(()), 0
    else:
        begins = skip_space(text, 0)
        if text.startswith(opener, begins):
            start = begins + len(opener)
        elif not context.final and opener.startswith(text[begins:]):
            return FamilyParse(()), None  # nothing yet, or the start of the opener: wait
        elif context.reasoning_open:
            start = 0
        else:
            return FamilyParse(()), 0
    ends = (*closers, *also_ending)
    end, closer = first_found(text, ends, start)
    if closer is not None:
        return FamilyParse((Thought(text[start:end]),)), end + len(closer) if closer in closers else end
    if context.final:
        return FamilyParse((Thought(text[start:]),)), len(text)
    stops = (*ends, *held)
    at = len(text) - held_back(text[start:], stops)
    return FamilyParse((Thought(text[start:at]),), open=Open(at, REASONING, Thought, stops)), None


def first_found(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str | None]:
    """The first of `markers` in `text` from `start`: (where, which), or (-1, None); of two at
    one place, the longer."""
    best, found = -1, None
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best < 0 or at < best or at == best and len(marker) > len(found)):
            best, found = at, marker
    return best, found


ENDED = "ended"  # the state after the end of the turn: nothing that follows is read


def read_turn(text: str, context: ParseContext, end_tokens: Sequence[str],
              read: Callable[[str, ParseContext], FamilyParse]) -> FamilyParse:
    """`read`'s parse of the text up to the first of `end_tokens` (the family's end of turn):
    where the model wrote one, the output has ended there (the context becomes final) and
    nothing after it is read. While the turn goes on, an end token stops the reader too."""
    if context.state == ENDED:
        return FamilyParse((), open=Open(len(text), ENDED, None, ()))
    end, _ = first_found(text, end_tokens)
    if end < 0:  # the text that may begin an end token waits
        cut = len(text) if context.final else len(text) - held_back(text, end_tokens)
        parsed = read(text[:cut], context)
        opened = parsed.open
        if opened is None or opened.stops is None:
            return parsed
        return _holding_end_tokens(text, cut, parsed, end_tokens)
    parsed = read(text[:end], replace(context, final=True))
    return FamilyParse(parsed.segments, parsed.error, None if context.final else Open(len(text), ENDED, None, ()))


def _holding_end_tokens(text: str, cut: int, parsed: FamilyParse, end_tokens: Sequence[str]) -> FamilyParse:
    """The parse of the text before `cut` (the start of an end token's start), with the end
    tokens among its stops. Where plain text grows, what waits is the end that may begin one
    of the stops, taken together: text held back for a marker of the body and then for an end
    token (`<` and `<`, where `<<` begins neither) is plain text up to the one end. (Only where
    the family held back no more than its stops say: otherwise its claim stands as it is, and
    the reader parses again at the next piece.)"""
    opened = parsed.open
    stops = (*opened.stops, *end_tokens)
    segments = parsed.segments
    family_held = text[opened.at:cut]
    if opened.grows is not None and held_back(family_held, opened.stops) == len(family_held):
        at = len(text) - held_back(text[opened.at:], stops)
        if at > opened.at:
            segments = (*segments, opened.grows(text[opened.at:at]))
            opened = replace(opened, at=at)
    return FamilyParse(segments, parsed.error, replace(opened, stops=stops))


def until_turn_end(text: str, context: ParseContext, end_tokens: Sequence[str]) -> tuple[str, ParseContext]:
    """The text up to the first of `end_tokens` (the family's end of turn) where the model wrote
    one: the output has ended there, so the context becomes final."""
    end, _ = first_found(text, end_tokens)
    if end < 0:
        return text, context
    return text[:end], replace(context, final=True)


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
