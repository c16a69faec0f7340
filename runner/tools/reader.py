"""The one reader of a model's output: every family's parse, fed as the text streams.

A family's parse is a plain function of the text (family.py). Read naively, a stream would
parse the whole text again for every piece: quadratic in the output's length. The reader
instead goes on from what the last parse left open (`Open`, which the family returns with its
segments while the output grows):

- **Resume.** The segments came from the text before `open.at`; the next parse reads only
  the text from there (with `open.state` saying where it starts). Text before it is never read
  again, so every character is parsed a bounded number of times, whatever the output's length.
- **Skip.** Until one of `open.stops` appears in the text that follows, no parse is needed at
  all: the new text is more of `open.grows` (content or reasoning; or, with `grows` None,
  changes nothing: a call whose end has not come). The reader only looks for the stops in the
  new text and holds back an end that may begin one: a few string searches per piece.

Both are claims a family makes about its own format; a wrong one shows as a stream that reads
differently from its whole text, which `verify=True` checks on every piece (the tests feed
every family so). The whitespace at the edges of the content and of the reasoning is the
reader's: dropped at the start, held at the end until more text follows it, dropped at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .family import Call, Family, ParseContext, PartialCall, Text, Thought
from .stops import Stops, stops_of
from .types import ArgumentsDelta, Delta, ParsedOutput, ReasoningDelta, TextDelta, ToolCall, ToolCallStart


# A call's arguments stream as they are written once this long (characters): a shorter call
# comes whole, its start and arguments together, so that one cut off by max_tokens or found
# malformed at its end was never started in the stream; a long one (a file written through a
# call) shows as it is written, as OpenAI's and llama-server's streams show it.
STREAM_ARGUMENTS_AFTER = 128


class EdgeTrimmer:
    """Drops the whitespace at the edges of a stream of text: leading whitespace at once,
    trailing whitespace held until more text follows it (then released), dropped at the end."""

    def __init__(self) -> None:
        self._is_started = False
        self._pending = ""

    def push(self, text: str) -> str:
        """The text to hand out now for `text`."""
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

    def drop_pending(self) -> None:
        """The whitespace held so far is forgotten (a call follows it)."""
        self._pending = ""


class _Stream:
    """Content or reasoning: what the parses since the resume point gave of it (raw), and what
    went out (trimmed)."""

    def __init__(self, delta: type[TextDelta] | type[ReasoningDelta]) -> None:
        self._delta = delta
        self.raw_since_resume = 0  # characters of raw text taken since the resume point
        self._trimmer = EdgeTrimmer()
        self.parts: list[str] = []  # what went out

    def take(self, raw: str, deltas: list[Delta]) -> None:
        """Raw text that follows what was taken."""
        self.raw_since_resume += len(raw)
        released = self._trimmer.push(raw)
        if released:
            self.parts.append(released)
            deltas.append(self._delta(released))

    def take_from(self, raw: str, at: int, deltas: list[Delta]) -> int:
        """A parse's segment of raw text, which starts `at` characters after the resume point:
        its part not taken yet is taken (what was taken of it is its beginning, the family's
        claims being true). Returns where it ends."""
        end = at + len(raw)
        if end > self.raw_since_resume:
            self.take(raw[self.raw_since_resume - at:] if self.raw_since_resume > at else raw, deltas)
        return end

    def drop_held_space(self) -> None:
        self._trimmer.drop_pending()


class OutputParser:
    """One output's reader: feed(piece) -> deltas, close() -> deltas, then result()."""

    def __init__(self, family: Family, call_id: Callable[[int], str], context: ParseContext,
                 verify: bool = False) -> None:
        self.family = family
        self._call_id = call_id
        self._context = replace(context, final=False)
        self._unsettled: list[str] = []  # the text from the resume point
        self._content = _Stream(TextDelta)
        self._reasoning = _Stream(ReasoningDelta)
        self._calls: list[ToolCall] = []
        self._calls_since_resume = 0
        self._num_started = 0  # calls whose start went out (a streamed one that never ended too)
        self._streaming: tuple[int, str, str, str] | None = None  # a call not yet whole: (index, id, name, sent)
        self._settled_error: str | None = None  # the last error of the text before the resume point
        self._error: str | None = None
        self._state: object = None  # where the text from the resume point is read from (None: the start)
        self._grows: type[Text] | type[Thought] | None = None  # what plain text appended there is
        self._stops: Stops | None = None  # until one of these appears (None: parse every piece)
        self._pending = ""  # the end of the text that may begin a stop
        self._reread_after = 0  # with stops: read again once this many characters came all the same (0: never)
        self._chars_unread = 0  # characters taken without a parse since the last one
        self._closed = False
        self._verify = verify
        self._whole: list[str] = []  # the whole text so far (verify=True only)

    # --- the interface the engine uses -------------------------------------------------------

    def feed(self, text: str) -> list[Delta]:
        if not text:
            return []
        if self._closed:
            raise ValueError("feed() after close(): the output has ended")
        self._unsettled.append(text)
        deltas: list[Delta] = []
        if not self._skipped(text, deltas):
            self._parse(final=False, deltas=deltas)
        if self._verify:
            self._whole.append(text)
            self._check_against_whole(final=False)
        return deltas

    def close(self) -> list[Delta]:
        if self._closed:
            return []
        self._closed = True
        deltas: list[Delta] = []
        self._parse(final=True, deltas=deltas)
        if self._verify:
            self._check_against_whole(final=True)
        return deltas

    @property
    def is_closed(self) -> bool:
        return self._closed

    def result(self) -> ParsedOutput:
        """The whole output, parsed: what the deltas add up to."""
        if not self._closed:
            raise ValueError("result() before close(): the output may go on")
        return self._so_far()

    def _so_far(self) -> ParsedOutput:
        content = "".join(self._content.parts)
        reasoning = "".join(self._reasoning.parts)
        return ParsedOutput(content=content or None, reasoning=reasoning or None, tool_calls=tuple(self._calls),
                            error=self._error)

    # --- skipping and parsing -----------------------------------------------------------------

    def _skipped(self, text: str, deltas: list[Delta]) -> bool:
        """Whether `text` could be taken without a parse (no stop in it: see the module's
        docstring). The one path every piece of plain text takes: kept to a few string searches."""
        stops = self._stops
        if stops is None:
            return False
        window = self._pending + text if self._pending else text
        if stops.occur_in(window):
            return False
        if self._reread_after:
            self._chars_unread += len(text)
            if self._chars_unread >= self._reread_after:
                return False
        held = stops.held(window)
        if held:
            self._pending = window[len(window) - held:]
            window = window[:len(window) - held]
        else:
            self._pending = ""
        grows = self._grows
        if grows is not None and window:
            (self._content if grows is Text else self._reasoning).take(window, deltas)
        return True

    def _parse(self, final: bool, deltas: list[Delta]) -> None:
        text = "".join(self._unsettled)
        parsed = self.family.parse(text, replace(self._context, final=final, state=self._state))
        segments = parsed.segments
        partial = segments[-1] if segments and type(segments[-1]) is PartialCall else None
        if partial is not None:
            segments = segments[:-1]
        self._take(segments, deltas)
        if partial is not None:
            self._stream_call(partial, deltas)
        elif final:
            self._streaming = None  # a call cut off or unreadable: it never became one
        self._error = parsed.error or self._settled_error
        self._stops = None
        self._chars_unread = 0
        opened = None if final else parsed.open
        if opened is None:
            return  # nothing claimed: the next piece parses the same text again, and more
        if opened.at:
            self._resume_at(text, opened.at, segments[len(segments) - opened.repeats:] if opened.repeats else ())
        self._state, self._grows = opened.state, opened.grows
        if opened.stops is not None:
            unsettled = text[opened.at:]
            stops = stops_of(opened.stops)
            held = stops.held(unsettled)
            # What grows is held back only where it may begin a stop; a family that holds back
            # more is parsed again at the next piece.
            if opened.grows is None or held == len(unsettled):
                self._stops = stops
                self._pending = unsettled[len(unsettled) - held:]
                self._reread_after = opened.reread_after

    def _take(self, segments: tuple, deltas: list[Delta]) -> None:
        """A parse's segments since the resume point, in order: what was not taken yet goes out
        (less the whitespace right before a call, in the families that drop it)."""
        content_at = reasoning_at = num_calls = 0  # how much of each the segments so far hold
        for segment in segments:
            kind = type(segment)
            if kind is Text:
                content_at = self._content.take_from(segment.text, content_at, deltas)
            elif kind is Thought:
                reasoning_at = self._reasoning.take_from(segment.text, reasoning_at, deltas)
            else:
                if num_calls >= self._calls_since_resume:
                    self._add_call(segment, deltas)
                num_calls += 1
        self._calls_since_resume = num_calls

    def _add_call(self, call: Call, deltas: list[Delta]) -> None:
        """A whole call: its start and arguments go out, or what its streamed start lacks."""
        if not self.family.keeps_space_before_calls:
            self._content.drop_held_space()
        streaming, self._streaming = self._streaming, None
        if streaming is not None and streaming[2] == call.name and call.arguments.startswith(streaming[3]):
            index, call_id, _, sent = streaming
        else:
            index, call_id, sent = self._num_started, self._call_id(len(self._calls)), ""
            self._num_started += 1
            deltas.append(ToolCallStart(index, call_id, call.name))
        self._calls.append(ToolCall(call_id, call.name, call.arguments))
        if call.arguments[len(sent):] or not sent:
            deltas.append(ArgumentsDelta(index, call.arguments[len(sent):]))

    def _stream_call(self, partial: PartialCall, deltas: list[Delta]) -> None:
        """A call not yet whole, once its arguments are long enough to be worth streaming: its
        start goes out once, then its arguments as they grow."""
        if self._streaming is None or self._streaming[2] != partial.name:
            if len(partial.arguments) < STREAM_ARGUMENTS_AFTER:
                return
            self._streaming = (self._num_started, self._call_id(len(self._calls)), partial.name, "")
            self._num_started += 1
            deltas.append(ToolCallStart(self._streaming[0], self._streaming[1], partial.name))
        index, call_id, name, sent = self._streaming
        if len(partial.arguments) > len(sent) and partial.arguments.startswith(sent):
            deltas.append(ArgumentsDelta(index, partial.arguments[len(sent):]))
            self._streaming = (index, call_id, name, partial.arguments)

    def _resume_at(self, text: str, at: int, repeated: tuple) -> None:
        """The text before `at` is settled: the next parse starts there (and gives the
        `repeated` segments, taken already, again)."""
        self._unsettled = [text[at:]]
        self._content.raw_since_resume = sum(len(segment.text) for segment in repeated if type(segment) is Text)
        self._reasoning.raw_since_resume = sum(len(segment.text) for segment in repeated if type(segment) is Thought)
        self._calls_since_resume = sum(type(segment) is Call for segment in repeated)
        self._settled_error = self._error

    # --- checking the family's claims -----------------------------------------------------------

    def _check_against_whole(self, final: bool) -> None:
        """The stream so far against the whole text read at once (verify=True): what went out
        must begin what the whole text gives (and, once closed, be all of it)."""
        whole = OutputParser(self.family, self._call_id, self._context)
        text = "".join(self._whole)
        whole._unsettled = [text]
        whole._parse(final=final, deltas=[])
        mine, theirs = self._so_far(), whole._so_far()
        for name in ("content", "reasoning"):
            streamed, read = getattr(mine, name) or "", getattr(theirs, name) or ""
            if not (read == streamed if final else read.startswith(streamed)):
                raise AssertionError(f"{self.family.name}: the streamed {name} {streamed!r} is not "
                                     f"{'' if final else 'the start of '}the whole text's {read!r} (text {text!r})")
        streamed_calls = [(call.name, call.arguments) for call in mine.tool_calls]
        read_calls = [(call.name, call.arguments) for call in theirs.tool_calls]
        if streamed_calls != read_calls[:len(streamed_calls)] or (final and streamed_calls != read_calls):
            raise AssertionError(f"{self.family.name}: the streamed calls {streamed_calls} are not the whole "
                                 f"text's {read_calls} (text {text!r})")
        if final and mine.error != theirs.error:
            raise AssertionError(f"{self.family.name}: the streamed error {mine.error!r} is not the whole "
                                 f"text's {theirs.error!r} (text {text!r})")
