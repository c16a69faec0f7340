"""MeetKai Functionary v3.2: the answer is a list of messages, each ">>>RECIPIENT\\n" then its
text: "all" for the user (content), a function's name for a call with JSON arguments.

    all
    Let me check.>>>get_weather
    {"city": "Paris"}>>>get_time
    {"city": "Paris"}

The generation prompt ends with the first ">>>", so the output starts with a recipient.
"python" (the code interpreter) may get raw code instead of JSON: {"code": ...}. The end
tokens are not text.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..family import (CUT_OFF, Call, CallSyntax, Family, FamilyParse, Open, ParseContext, PartialCall, Segment, Text,
                      arguments_json, held_back, reread_pace, skip_space)
from ..partial_json import settled_prefix
from ._marked_calls import JSON_ENDS, UNREADABLE, JsonCutOff, json_value_at, without

NEXT = ">>>"
ALL = "all"  # the recipient of a message to the user
PYTHON = "python"
END_TOKENS = ("<|eot_id|>", "<|eom_id|>")
_RECIPIENT = re.compile(r"[A-Za-z_][\w.\-]*")
_RECIPIENT_SO_FAR = re.compile(r"[\w.\-]*")

# Where a parse goes on from (the output's start is None: the first message, whose ">>>" the
# prompt wrote).
MESSAGE = "message"  # at the ">>>" of a message that is not the first
TEXT = "text"  # in a text message: content up to the next ">>>"
PLAIN = "plain"  # the first message named no recipient: the rest of the output is content
AFTER_CALL = "after call"  # just after a call's arguments
RAW_MESSAGE = "raw message"  # in a message that is not a call: its text as written, up to the next ">>>"
RAW = "raw"  # after a recipient that cannot be read: the rest of the output as written

# Content goes on until the next message or an end token (dropped from it).
CONTENT_STOPS = (NEXT, *END_TOKENS)
# A call's JSON may end at a closing bracket; the next message ends python's code.
CALL_STOPS = (*JSON_ENDS, NEXT)


class _Reader:
    """One pass over the messages from where the text starts; `segments`, `error` and `open`
    are the parse so far."""

    def __init__(self, text: str, context: ParseContext) -> None:
        self.text, self.context = text, context
        self.segments: list[Segment] = []
        self.error: str | None = None
        self.open: Open | None = None  # where the next parse goes on from (set where the reading stops)

    def result(self) -> FamilyParse:
        return FamilyParse(tuple(self.segments), self.error, None if self.context.final else self.open)

    def add_text(self, text: str) -> None:
        if text:
            self.segments.append(Text(text))

    def read(self) -> FamilyParse:
        text, state = self.text, self.context.state
        first = state is None
        if state is None:
            position = len(NEXT) if text.startswith(NEXT) else 0
            if not self.context.final and not position and NEXT.startswith(text):
                return self.result()  # nothing yet, or the start of a ">>>" the prompt did not write
        elif state == MESSAGE:
            position = len(NEXT)
        elif state == TEXT:
            position = self.text_message(0)
        elif state == AFTER_CALL:
            position = self.after_call(0)
        elif state == RAW_MESSAGE:
            position = self.raw_message(0, 0)
        elif state == PLAIN:
            position = self.content(0, None, PLAIN)
        else:
            position = self.raw(0)
        while position is not None:
            if position == len(text):  # the next message has not begun
                position = self.wait_for_message(position, first)
            else:
                position = self.message(position, first)
                first = False
        return self.result()

    def wait_for_message(self, start: int, first: bool, stops: tuple[str, ...] | None = None) -> None:
        """The message at `start` is read again from its ">>>" (the first from the output's
        start) by the next parse: when one of `stops` comes, or at every piece."""
        self.open = Open(0, None, None, stops) if first else Open(start - len(NEXT), MESSAGE, None, stops)

    def message(self, start: int, first: bool) -> int | None:
        """Reads the message at `start`: where the next one starts, None when none does."""
        text, final = self.text, self.context.final
        newline = text.find("\n", start)
        recipient = text[start:newline if newline >= 0 else len(text)]
        if newline < 0:
            if not final and _RECIPIENT_SO_FAR.fullmatch(recipient):
                return self.wait_for_message(start, first)  # the recipient is still coming
            if recipient in ("", ALL):
                return None
            if _RECIPIENT.fullmatch(recipient) and not first:
                self.error = CUT_OFF  # a call cut off before its arguments: dropped
                return None
        if newline < 0 or (recipient != ALL and not _RECIPIENT.fullmatch(recipient)):
            if first:  # no recipient: the model answered in plain text
                return self.content(start, None, PLAIN)
            self.error = UNREADABLE
            return self.raw(start - len(NEXT))
        if recipient == ALL:
            return self.text_message(newline + 1)
        return self.call_message(start, recipient, newline + 1, first)

    def content(self, start: int, end: int | None, state: str) -> None:
        """Content from `start` to `end`, less the end tokens; to the end of the output where
        `end` is None (less what may begin a marker, while it grows: the next parse goes on
        from there, in `state`)."""
        if end is None:
            end = len(self.text) if self.context.final else self._settled_end(start)
            self.open = Open(end, state, Text, CONTENT_STOPS)
        self.add_text(without(self.text[start:end], END_TOKENS))

    def _settled_end(self, start: int) -> int:
        """Where the text that may begin a marker starts. An end token's last ">" may begin a
        ">>>": the token waits with it (it is never cut, or what shows of it would be text)."""
        text = self.text
        at = len(text) - held_back(text[start:], CONTENT_STOPS)
        for token in END_TOKENS:
            found = text.find(token, max(start, at - len(token) + 1))
            if 0 <= found < at:
                at = found
        return at

    def text_message(self, start: int) -> int | None:
        end = self.text.find(NEXT, start)
        self.content(start, end if end >= 0 else None, TEXT)
        return end + len(NEXT) if end >= 0 else None

    def call_message(self, message_start: int, name: str, start: int, first: bool) -> int | None:
        text, final = self.text, self.context.final
        found = json_value_at(text, start)
        if isinstance(found, tuple) and isinstance(found[0], dict):
            self.segments.append(Call(name, arguments_json(found[0])))
            return self.after_call(found[1])
        if name == PYTHON and not (isinstance(found, JsonCutOff) and not final):
            return self.code_message(message_start, start, first)
        if isinstance(found, JsonCutOff):
            if final:
                self.error = CUT_OFF  # a call cut off by the end of the output: dropped
                return None
            body = skip_space(text, start)
            if text.startswith("{", body) and (not first or name in self.context.tools):
                # Its arguments stream as arguments_json will write them; read again at a pace too.
                partial = PartialCall(name, settled_prefix(text[body:]))
                self.segments.append(partial)
                self.wait_for_message(message_start, first, CALL_STOPS)
                self.open = replace(self.open, reread_after=reread_pace(partial))
                return None
            return self.wait_for_message(message_start, first, CALL_STOPS)
        if first and name not in self.context.tools:
            return self.content(message_start, None, PLAIN)  # a first line that names no function: plain text
        # Not JSON arguments: the message as it is, as content.
        return self.raw_message(self.raw_start(message_start), start)

    def raw_message(self, raw_start: int, body: int) -> int | None:
        """The text of a message that is not a call, from `raw_start`, as written: where the
        next message starts (its ">>>" is looked for from `body`)."""
        text = self.text
        self.error = UNREADABLE
        end = text.find(NEXT, body)
        if end >= 0:
            self.add_text(text[raw_start:end])
            return end + len(NEXT)
        at = len(text) if self.context.final else len(text) - held_back(text[raw_start:], (NEXT,))
        self.add_text(text[raw_start:at])
        self.open = Open(at, RAW_MESSAGE, Text, (NEXT,))
        return None

    def code_message(self, message_start: int, start: int, first: bool) -> int | None:
        text = self.text
        end = text.find(NEXT, start)
        if end < 0 and not self.context.final:
            # The code runs to the next message or the end of the output.
            return self.wait_for_message(message_start, first, CALL_STOPS)
        code = without(text[start:end if end >= 0 else len(text)], END_TOKENS).strip()
        if not code:  # "python" and nothing after it
            if end < 0:
                self.error = CUT_OFF  # cut off by the end of the output: dropped
                return None
            self.add_text(text[self.raw_start(message_start):end])
            self.error = UNREADABLE
            return end + len(NEXT)
        self.segments.append(Call(PYTHON, arguments_json({"code": code})))
        return end + len(NEXT) if end >= 0 else None

    def after_call(self, position: int) -> int | None:
        """After a call's arguments: spaces and end tokens, then the next message or the end;
        other text there is content, up to the next message."""
        text, final = self.text, self.context.final
        stripped = without(text[position:], END_TOKENS).lstrip()
        if stripped.startswith(NEXT):
            return text.index(NEXT, position) + len(NEXT)
        if not stripped or (not final and any(marker.startswith(stripped) for marker in CONTENT_STOPS)):
            self.open = Open(position, AFTER_CALL)  # what follows the spaces says
            return None
        return self.text_message(position)

    def raw(self, start: int) -> None:
        """The rest of the output, as written, from `start`."""
        self.add_text(self.text[start:])
        self.open = Open(len(self.text), RAW, Text, ())

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
