"""MeetKai Functionary v3.2: the answer is a list of messages, each ">>>RECIPIENT\\n" then its
text: "all" for the user (content), a function's name for a call with JSON arguments.

    all
    Let me check.>>>get_weather
    {"city": "Paris"}>>>get_time
    {"city": "Paris"}

The generation prompt ends with the first ">>>", so the output starts with a recipient.
"python" (the code interpreter) may get raw code instead of JSON: {"code": ...}.
"""

from __future__ import annotations

import re

from ..family import (CUT_OFF, Call, CallSyntax, Family, FamilyParse, ParseContext, Segment, Text, arguments_json,
                      settled_text)
from ._marked_calls import UNREADABLE, JsonCutOff, json_value_at, without

NEXT = ">>>"
CONTENT = "all"
PYTHON = "python"
END_TOKENS = ("<|eot_id|>", "<|eom_id|>")
_RECIPIENT = re.compile(r"[A-Za-z_][\w.\-]*")
_RECIPIENT_SO_FAR = re.compile(r"[\w.\-]*")


class _Reader:
    """One pass over the messages; `segments` and `error` are the parse so far."""

    def __init__(self, text: str, context: ParseContext) -> None:
        self.text, self.context = text, context
        self.segments: list[Segment] = []
        self.error: str | None = None

    def result(self) -> FamilyParse:
        return FamilyParse(tuple(self.segments), self.error)

    def content(self, start: int, end: int | None = None) -> None:
        """Text from `start` to `end` (to the end of the output, settled, when None)."""
        if end is None:  # the end tokens dropped first: what waits is the start of a marker in the rest
            piece = settled_text(without(self.text[start:], END_TOKENS), self.context, (NEXT, *END_TOKENS))
        else:
            piece = without(self.text[start:end], END_TOKENS)
        self.segments.append(Text(piece))

    def read(self) -> FamilyParse:
        text, final = self.text, self.context.final
        position = len(NEXT) if text.startswith(NEXT) else 0
        if not final and not position and NEXT.startswith(text):
            return self.result()  # nothing yet, or the start of a ">>>" the prompt did not write
        first = True
        while position is not None and position < len(text):
            position = self.message(position, first)
            first = False
        return self.result()

    def message(self, start: int, first: bool) -> int | None:
        """Reads the message at `start`: where the next one starts, None when none does."""
        text, final = self.text, self.context.final
        newline = text.find("\n", start)
        recipient = text[start:newline if newline >= 0 else len(text)]
        if newline < 0:
            if not final and _RECIPIENT_SO_FAR.fullmatch(recipient):
                return None  # the recipient is still coming
            if recipient in ("", CONTENT):
                return None
            if _RECIPIENT.fullmatch(recipient) and not first:
                self.cut_off(start)
                return None
        if newline < 0 or (recipient != CONTENT and not _RECIPIENT.fullmatch(recipient)):
            if first:  # no recipient: the model answered in plain text
                self.content(start)
            else:
                self.segments.append(Text(text[start - len(NEXT):]))
                self.error = UNREADABLE
            return None
        if recipient == CONTENT:
            return self.text_message(newline + 1)
        return self.call_message(start, recipient, newline + 1, first)

    def text_message(self, start: int) -> int | None:
        end = self.text.find(NEXT, start)
        self.content(start, end if end >= 0 else None)
        return end + len(NEXT) if end >= 0 else None

    def call_message(self, message_start: int, name: str, start: int, first: bool) -> int | None:
        text, final = self.text, self.context.final
        found = json_value_at(text, start)
        if isinstance(found, tuple) and isinstance(found[0], dict):
            self.segments.append(Call(name, arguments_json(found[0])))
            return self.after_call(found[1])
        if name == PYTHON and not (isinstance(found, JsonCutOff) and not final):
            return self.code_message(start)
        if isinstance(found, JsonCutOff):
            if final:
                self.cut_off(message_start)
            return None
        if first and name not in self.context.tools:
            self.content(message_start)  # a first line that names no function: plain text
            return None
        end = text.find(NEXT, start)  # not JSON arguments: the message as it is, as content
        raw = text[self.raw_start(message_start):end if end >= 0 else len(text)]
        self.segments.append(Text(raw if end >= 0 else settled_text(raw, self.context, (NEXT,))))
        self.error = UNREADABLE
        return end + len(NEXT) if end >= 0 else None

    def code_message(self, start: int) -> int | None:
        end = self.text.find(NEXT, start)
        if end < 0 and not self.context.final:
            return None  # the code runs to the next message or the end of the output
        code = without(self.text[start:end if end >= 0 else len(self.text)], END_TOKENS).strip()
        if not code:  # "python" and nothing after it
            if end < 0:
                self.cut_off(start - len(PYTHON) - 1)
                return None
            self.segments.append(Text(self.text[self.raw_start(start - len(PYTHON) - 1):end]))
            self.error = UNREADABLE
            return end + len(NEXT)
        self.segments.append(Call(PYTHON, arguments_json({"code": code})))
        return end + len(NEXT) if end >= 0 else None

    def after_call(self, position: int) -> int | None:
        """After a call's arguments: spaces and end tokens, then the next message or the end;
        other text there is content, up to the next message."""
        text, final = self.text, self.context.final
        rest = without(text[position:], END_TOKENS)
        stripped = rest.lstrip()
        if stripped.startswith(NEXT):
            return text.index(NEXT, position) + len(NEXT)
        if not stripped or (not final and any(marker.startswith(stripped) for marker in (NEXT, *END_TOKENS))):
            return None
        end = text.find(NEXT, position)
        self.content(position, end if end >= 0 else None)
        return end + len(NEXT) if end >= 0 else None

    def cut_off(self, message_start: int) -> None:
        """A call cut off by the end of the output: its raw text, from its ">>>", is the last
        segment (the reader drops it by that marker). The first message's ">>>" is the
        prompt's: its raw text holds no marker and is left out here."""
        start = self.raw_start(message_start)
        if start < message_start:
            self.segments.append(Text(self.text[start:]))
        self.error = CUT_OFF

    def raw_start(self, message_start: int) -> int:
        """Where a message's raw text starts: its ">>>" when the output wrote it."""
        before = message_start - len(NEXT)
        return before if before >= 0 and self.text.startswith(NEXT, before) else message_start


def parse(text: str, context: ParseContext) -> FamilyParse:
    return _Reader(text, context).read()


FAMILY = Family(
    name="functionary-v3.2",
    description='>>>NAME\\n{...} messages, >>>all\\n for text (Functionary v3.2)',
    parse=parse,
    fingerprints=((">>>all", ">>>${recipient}"), (">>>all", "<|start_header_id|>")),
    markers=(NEXT, *END_TOKENS),
    priority=60,
    # The generation prompt writes the first ">>>": the first call starts at its function's
    # name, the next ones after a ">>>". A call's opening has no marker of its own before the
    # name, so free text cannot end at one: `auto` leaves the output free.
    call_syntax=CallSyntax(call_open="{name}\n", call_close="", separator=NEXT, constrains_auto=False),
)
