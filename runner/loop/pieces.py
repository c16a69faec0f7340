"""What goes out with a request's text pieces besides the text itself: the log probabilities of
the tokens behind each piece, and (with tools, or a model that reasons) what the text parses
into: content, reasoning and calls, with text that may begin a call held back.

The output is read when someone asks what a piece parses into (a stream's consumer, on its own
thread, when it takes the piece), or when the output ends (its result): never on the step's
critical path token by token. A consumer that falls behind and takes several pieces at once
gets them read as one; an output no one streams is read once, whole. What a piece parses into
is what the output's reader gave up to that piece and had not handed out yet, so a consumer
that asks every piece in turn gets every delta once, in order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .detok import TextAssembler
from ..errors import RequestFault
from ..sampling.logprobs import TokenLogprob
from ..tools import Delta

if TYPE_CHECKING:
    from ..tools.reader import OutputParser
    from ..tools.types import ParsedOutput


class OutputPieces:
    """One request's output as it streams: its text (detokenized, stop strings matched, text
    that may begin one held back), the log probabilities behind it, and its reading."""

    def __init__(self, tool_parser: OutputParser | None, wants_logprobs: bool, stop: Sequence[str] = (),
                 min_indent: int = 0) -> None:
        self.tool_parser = tool_parser
        self.logprobs: list[TokenLogprob] | None = [] if wants_logprobs else None
        self._num_logprobs_streamed = 0  # of self.logprobs, how many went out with text pieces
        self.assembler = TextAssembler(stop, min_indent)
        self.text_parts: list[str] = []  # one a piece
        self._has_emitted = False  # whether a piece went out (the first carries a scored prompt's logprobs)
        self.has_reached_stop_string = False
        # The reading, shared by the step's thread and a consumer's: under the lock.
        self._lock = threading.Lock()
        self._num_parts_read = 0
        self._deltas: list[Delta] = []  # what the reader gave, in order
        self._num_handed = 0  # of those, how many went out with a piece
        self._fault: RequestFault | None = None  # the reader failed: nothing more is read

    def note_emitted(self) -> bool:
        """A piece goes out: whether it is the first."""
        is_first, self._has_emitted = not self._has_emitted, True
        return is_first

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def is_read(self) -> bool:
        """Whether the output is read (it has a reader: with tools, or a model that reasons)."""
        return self.tool_parser is not None

    def take_bytes(self, piece: bytes) -> str:
        """A token's bytes: the text they make ready to emit (a stop string reached ends it)."""
        text, self.has_reached_stop_string = self.assembler.feed(piece)
        if text:
            self.text_parts.append(text)
        return text

    def release_held(self) -> str:
        """The text held back as a possible stop string's start (the output ended without one)."""
        text = self.assembler.flush()
        if text:
            self.text_parts.append(text)
        return text

    # --- reading ---------------------------------------------------------------------------------

    def deltas_until(self, num_parts: int, close: bool = False) -> tuple[Delta, ...]:
        """What the text's first `num_parts` parts (all of it, and the end, with `close`) parse
        into and was not handed out yet. A fault of the reader ends the reading: nothing more
        comes of it here (the output's result says why)."""
        with self._lock:
            try:
                self._read(len(self.text_parts) if close else num_parts, close)
            except RequestFault:
                pass
            new = self._deltas[self._num_handed:]
            self._num_handed = len(self._deltas)
        return tuple(new)

    def parsed(self) -> ParsedOutput:
        """The whole output parsed (its reading closed first: a cancelled output was not closed
        when it ended); RequestFault where the reader failed."""
        with self._lock:
            self._read(len(self.text_parts), close=True)
            try:
                return self.tool_parser.result()
            except Exception as error:
                raise RequestFault("parsing its output", error) from error

    def _read(self, num_parts: int, close: bool) -> None:
        """Feed the reader the parts up to `num_parts` not read yet (as one text), and close it."""
        if self._fault is not None:
            raise self._fault
        parser = self.tool_parser
        try:
            if num_parts > self._num_parts_read:
                text = "".join(self.text_parts[self._num_parts_read:num_parts])
                self._num_parts_read = num_parts
                self._deltas += parser.feed(text)
            if close and not parser.is_closed:
                self._deltas += parser.close()
        except Exception as error:
            self._fault = RequestFault("parsing its output", error)
            raise self._fault from error

    def take_unstreamed_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The logprobs not yet handed out with a text piece (the ones a new piece carries)."""
        if not self.logprobs:
            return ()
        new = tuple(self.logprobs[self._num_logprobs_streamed:])
        self._num_logprobs_streamed = len(self.logprobs)
        return new
