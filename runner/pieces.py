"""What goes out with a request's text pieces besides the text itself: the log probabilities of
the tokens behind each piece, and (with tools, or a model that reasons) what the text parses
into: content, reasoning and calls, with text that may begin a call held back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .detok import TextAssembler
from .errors import RequestFault
from .logprobs import TokenLogprob
from .tools import Delta

if TYPE_CHECKING:
    from .tools.reader import OutputParser
    from .tools.types import ParsedOutput


class OutputPieces:
    """One request's output as it streams: its text (detokenized, stop strings matched, text
    that may begin one held back), the log probabilities behind it, and its parse."""

    def __init__(self, tool_parser: OutputParser | None, wants_logprobs: bool, stop: Sequence[str] = ()) -> None:
        self.tool_parser = tool_parser
        self.logprobs: list[TokenLogprob] | None = [] if wants_logprobs else None
        self._num_logprobs_streamed = 0  # of self.logprobs, how many went out with text pieces
        self.assembler = TextAssembler(stop)
        self.text_parts: list[str] = []
        self.has_reached_stop_string = False

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

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

    def parse(self, text: str, close: bool) -> tuple[Delta, ...] | None:
        """What a new piece of text parses into (None without a parser: the text is all there
        is); `close`: the output is whole, so held-back text is released (once: closing again
        adds nothing)."""
        if self.tool_parser is None:
            return None
        try:
            deltas = self.tool_parser.feed(text) if text else []
            if close:
                deltas += self.tool_parser.close()
        except Exception as error:
            raise RequestFault("parsing its output", error) from error
        return tuple(deltas)

    def parsed(self) -> ParsedOutput:
        """The whole output parsed (closing the parse first: a cancelled output was not closed
        when it ended)."""
        self.parse("", close=True)
        try:
            return self.tool_parser.result()
        except Exception as error:
            raise RequestFault("parsing its output", error) from error

    def take_unstreamed_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The logprobs not yet handed out with a text piece (the ones a new piece carries)."""
        if not self.logprobs:
            return ()
        new = tuple(self.logprobs[self._num_logprobs_streamed:])
        self._num_logprobs_streamed = len(self.logprobs)
        return new
