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

The turn's tokens (<|CHATBOT_TOKEN|>, <|END_OF_TURN_TOKEN|>) are not text. The template offers
the model a `directly-answer` tool besides the client's ("use it if calling the other tools is
unnecessary"): a call to it, where the client offered no tool of that name, is no call.
"Action:" that no code fence follows is text.
"""

from __future__ import annotations

import re

from ..family import CUT_OFF, CallSyntax, Family, FamilyParse, ParseContext, Segment, Text, nonempty
from ._marked_calls import UNREADABLE, JsonBroken, JsonCutOff, json_value_at, named_calls, skip_space, without

ACTION = "Action:"
FENCE = "```"
DIRECTLY_ANSWER = "directly-answer"
START_OF_TURN, CHATBOT, END_OF_TURN = "<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
TURN_MARKERS = (START_OF_TURN, CHATBOT, END_OF_TURN)

# "Action:" at the start of a line (or of the output), then the fence and its language tag.
_OPENER = re.compile(r"(?:^|(?<=\n))[ \t]*Action:[ \t]*\n?[ \t]*```[ \t]*(?:json)?[ \t]*\n?")


def parse(text: str, context: ParseContext) -> FamilyParse:
    text = without(text, TURN_MARKERS)
    segments: list[Segment] = []
    error = None
    position = 0
    held = len(text)  # where the text that waits for more starts
    while (opener := _OPENER.search(text, position)) is not None:
        rest = text[opener.end():].lstrip(" \t")
        if not context.final and (not rest or "json".startswith(rest)):
            held = opener.start()  # the fence's language tag, or the newline after it, may still come
            break
        found = json_value_at(text, opener.end())
        if isinstance(found, JsonCutOff):
            if not context.final:
                held = opener.start()
                break
            # A call cut off by the end of the output is dropped: the text before it is kept;
            # the call as written ("Action:", the fence, its JSON so far) holds none of the
            # family's markers (those are the turn's tokens), so it is left out here.
            segments.append(Text(text[position:opener.start()]))
            return FamilyParse(nonempty(segments), CUT_OFF)
        value, end = found if not isinstance(found, JsonBroken) else (None, len(text))
        calls = None if value is None else named_calls(value, "tool_name", ("parameters", "arguments"))
        if calls is None:  # not calls: the model's text, as it wrote it
            segments.append(Text(text[position:end]))
            error, position = UNREADABLE, end
            continue
        closing = skip_space(text, end)
        if text.startswith(FENCE, closing):
            end = closing + len(FENCE)
        elif not context.final and FENCE.startswith(text[closing:]):
            held = opener.start()  # the closing fence may still come
            break
        segments.append(Text(text[position:opener.start()]))
        segments += [call for call in calls if call.name != DIRECTLY_ANSWER or DIRECTLY_ANSWER in context.tools]
        position = end
    if not context.final:
        held = min(held, _settled_end(text, position))
    segments.append(Text(text[position:max(held, position)]))
    return FamilyParse(nonempty(segments), error)


def _settled_end(text: str, start: int) -> int:
    """Where the text that may still become an "Action:" opener (or a turn token) starts."""
    last_line = max(text.rfind("\n", start) + 1, start)
    line_before = max(text.rfind("\n", start, last_line - 1) + 1, start) if last_line > start else start
    for line_start in (line_before, last_line):
        if _may_open(text[line_start:].lstrip(" \t")):
            return line_start
    for marker in TURN_MARKERS:
        for size in range(len(marker) - 1, 0, -1):
            if text.endswith(marker[:size]) and len(text) - size >= start:
                return len(text) - size
    return len(text)


def _may_open(tail: str) -> bool:
    """Whether the end of the output (its last line, or its last two) may grow into the opener."""
    if len(tail) < len(ACTION):
        return ACTION.startswith(tail)
    if not tail.startswith(ACTION):
        return False
    after = tail[len(ACTION):].lstrip(" \t")
    if after.startswith("\n"):
        after = after[1:].lstrip(" \t")
    return "\n" not in after and len(after) < len(FENCE) and FENCE.startswith(after)


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
