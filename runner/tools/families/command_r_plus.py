"""Cohere Command R+ (c4ai-command-r-plus, its tool-use template): "Action:" on a line of its
own, then the calls as a fenced JSON list of {"tool_name", "parameters"}:

    I will look up the weather.
    Action:
    ```json
    [
        {
            "tool_name": "get_weather",
            "parameters": {"city": "Paris"}
        }
    ]
    ```

The turn's tokens (<|CHATBOT_TOKEN|>, <|END_OF_TURN_TOKEN|>) are not text: the output is read
without them, wherever they stand. The template offers the model a `directly-answer` tool
besides the client's ("use it if calling the other tools is unnecessary"): a call to it, where
the client offered no tool of that name, is no call. "Action:" that no code fence follows is
text.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..family import (CONTENT, CUT_OFF, CallSyntax, Family, FamilyParse, Open, ParseContext, Segment, Text, held_back,
                      nonempty, reread_pace)
from ._marked_calls import (JSON_ENDS, UNREADABLE, JsonBroken, JsonCutOff, Keys, first_call_partial, json_value_at,
                            named_calls, skip_space)

ACTION = "Action:"
FENCE = "```"
LANGUAGE = "json"
DIRECTLY_ANSWER = "directly-answer"
START_OF_TURN, CHATBOT, END_OF_TURN = "<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
TURN_MARKERS = (START_OF_TURN, CHATBOT, END_OF_TURN)
_TURN_MARKER = re.compile("|".join(re.escape(marker) for marker in TURN_MARKERS))

# "Action:" at the start of a line, then the fence and its language tag: after a newline, or
# (matched there) at the output's start.
_OPENER_AT_START = re.compile(r"[ \t]*Action:[ \t]*\n?[ \t]*```[ \t]*(?:json)?[ \t]*\n?")
_OPENER = re.compile(r"(?<=\n)" + _OPENER_AT_START.pattern)

# In the middle of a line, content goes on as written until a line starts with what may begin
# an opener (its blanks, its "Action:", a turn token), or a turn token comes.
CONTENT_STOPS = ("\n ", "\n\t", "\nA", "\n<", *TURN_MARKERS)
# Where a parse goes on from, besides the output's start (None, a line's start) and CONTENT (in
# the middle of a line): a line's start in the middle of the output, and the text after a
# fenced block that is not JSON (all of it content as written).
LINE_START = "line start"
RAW = "raw"


CALL_KEYS = Keys(("tool_name",), ("parameters", "arguments"))

def parse(text: str, context: ParseContext) -> FamilyParse:
    # The start of a turn token at the end waits, left out of the text read (measured in the
    # text as written: what is left around a token taken out never grows into another).
    unmarked = _Unmarked(text if context.final else text[:len(text) - held_back(text, TURN_MARKERS)])
    parsed = _parse(unmarked.text, context)
    if parsed.open is None:
        return parsed
    return replace(parsed, open=replace(parsed.open, at=unmarked.position_in_text(parsed.open.at)))


class _Unmarked:
    """A text less the turn tokens, and the way back from a position in it to one in the text
    (past the tokens taken out there, so that the text from it holds none of them)."""

    def __init__(self, text: str) -> None:
        self._cuts: list[tuple[int, int]] = []  # (where tokens were taken out, how many characters so far)
        pieces = []
        last = taken = 0
        for token in _TURN_MARKER.finditer(text):
            pieces.append(text[last:token.start()])
            taken += token.end() - token.start()
            self._cuts.append((token.end() - taken, taken))
            last = token.end()
        self.text = "".join(pieces) + text[last:] if self._cuts else text

    def position_in_text(self, position: int) -> int:
        taken = 0
        for cut, so_far in self._cuts:
            if cut > position:
                break
            taken = so_far
        return position + taken


def _parse(text: str, context: ParseContext) -> FamilyParse:
    """The text less the turn tokens, from a line's start (the output's, or LINE_START) or from
    the middle of one (CONTENT)."""
    if context.state == RAW:
        return _raw(text, 0, context, [], None)
    segments: list[Segment] = []
    error = None
    position = 0
    at_line_start = context.state in (None, LINE_START)
    while (opener := _opener(text, position, at_line_start and position == 0)) is not None:
        if not context.final and _may_grow(text, opener.end()):
            # The fence's language tag, or the newline after it, may still come.
            return _waiting(text, position, opener.start(), context, segments, error, None)
        found = json_value_at(text, opener.end())
        if isinstance(found, JsonCutOff):
            if not context.final:  # read again when a bracket may have closed the JSON, or at a pace: its first call streams
                waiting = _waiting(text, position, opener.start(), context, segments, error, JSON_ENDS)
                partial = first_call_partial(text[opener.end():], CALL_KEYS)
                return replace(waiting, segments=(*waiting.segments, *([partial] if partial else [])),
                               open=replace(waiting.open, reread_after=reread_pace(partial)))
            # A call cut off by the end of the output is dropped: the text before it is kept.
            segments.append(Text(text[position:opener.start()]))
            return FamilyParse(nonempty(segments), CUT_OFF)
        if isinstance(found, JsonBroken):  # not JSON: the rest is the model's text, as it wrote it
            return _raw(text, position, context, segments, UNREADABLE)
        value, end = found
        calls = named_calls(value, *CALL_KEYS.name, CALL_KEYS.arguments)
        if calls is None:  # not calls: the model's text, as it wrote it
            segments.append(Text(text[position:end]))
            error, position = UNREADABLE, end
            continue
        closing = skip_space(text, end)
        if text.startswith(FENCE, closing):
            end = closing + len(FENCE)
        elif not context.final and _may_begin(text, closing, FENCE):
            # The closing fence may still come.
            return _waiting(text, position, opener.start(), context, segments, error, None)
        segments.append(Text(text[position:opener.start()]))
        segments += [call for call in calls if call.name != DIRECTLY_ANSWER or DIRECTLY_ANSWER in context.tools]
        position = end
    if context.final:
        segments.append(Text(text[position:]))
        return FamilyParse(nonempty(segments), error)
    at, line_start = _settled_end(text, position, at_line_start and position == 0)
    segments.append(Text(text[position:at]))
    if line_start:
        # A line that may still become an opener is read again at every piece until it is
        # settled (a turn token may yet stand anywhere in it, which no stop can tell).
        return FamilyParse(nonempty(segments), error, Open(at, context.state if at == 0 else LINE_START, Text))
    return FamilyParse(nonempty(segments), error, Open(at, context.state if at == 0 else CONTENT, Text, CONTENT_STOPS))


def _opener(text: str, position: int, at_line_start: bool) -> re.Match | None:
    """The next opener from `position` (which may be a line's start)."""
    if at_line_start and (found := _OPENER_AT_START.match(text, position)):
        return found
    return _OPENER.search(text, position)


def _may_grow(text: str, end: int) -> bool:
    """Whether the text after an opener may still be its language tag (or blanks before it)."""
    rest = end
    while rest < len(text) and text[rest] in " \t":
        rest += 1
    return _may_begin(text, rest, LANGUAGE)


def _may_begin(text: str, position: int, marker: str) -> bool:
    """Whether the text from `position` (to its end) is the start of `marker` (or nothing)."""
    return len(text) - position <= len(marker) and marker.startswith(text[position:])


def _waiting(text: str, position: int, opener: int, context: ParseContext, segments: list[Segment],
             error: str | None, stops: tuple[str, ...] | None) -> FamilyParse:
    """A call whose opener starts at `opener` (a line's start) has not ended: read again from
    there when one of `stops` comes."""
    segments.append(Text(text[position:opener]))
    state = context.state if opener == 0 else LINE_START
    return FamilyParse(nonempty(segments), error, Open(opener, state, None, stops))


def _settled_end(text: str, start: int, at_line_start: bool) -> tuple[int, bool]:
    """Where the text that may still become an opener starts (a line's start: True), or the
    end of the text (False) where none may. An opener spans two lines at most: the last line,
    or the one before it, may begin one."""
    lines = [start] if at_line_start else []  # the starts of the last two lines from `start`
    last = text.rfind("\n", start)
    if last >= 0:
        before = text.rfind("\n", start, last)
        lines = [before + 1, last + 1] if before >= 0 else [*lines, last + 1]
    for line in lines:
        if _may_open(text[line:]):
            return line, True
    return len(text), False


def _may_open(line: str) -> bool:
    """Whether text from a line's start (its last line, or its last two) may still grow into an
    opener (the fence not yet complete)."""
    rest = line.lstrip(" \t")
    if len(rest) < len(ACTION):
        return ACTION.startswith(rest)
    if not rest.startswith(ACTION):
        return False
    after = rest[len(ACTION):].lstrip(" \t")
    if after.startswith("\n"):
        after = after[1:].lstrip(" \t")
    return len(after) < len(FENCE) and FENCE.startswith(after)


def _raw(text: str, position: int, context: ParseContext, segments: list[Segment], error: str | None) -> FamilyParse:
    """The text from `position` on, all of it content as written."""
    segments.append(Text(text[position:]))
    return FamilyParse(nonempty(segments), error, Open(len(text), RAW, Text, TURN_MARKERS))


FAMILY = Family(
    name="command-r-plus",
    description='Action:\\n```json\\n[{"tool_name": ..., "parameters": {...}}]\\n``` (Cohere Command R+)',
    parse=parse,
    # The R7B template (command-r7b) writes <|START_ACTION|> and mentions "Action:" in prose.
    fingerprints=(("Write \\'Action:\\' followed by a json-formatted list", '"tool_name"'),
                  ("Action:\\n```json", '"tool_name"', CHATBOT)),
    markers=TURN_MARKERS,
    priority=60,
    # The calls as the template writes them back into the history.
    call_syntax=CallSyntax(block_open="Action:\n```json\n[\n", call_open='{"tool_name": "{name}", "parameters": ',
                           call_close="}", separator=",\n", block_close="\n]\n```"),
)
