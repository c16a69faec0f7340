"""What goes out with a request's text pieces besides the text itself: the log probabilities of
the tokens behind each piece, and (with tools, or a model that reasons) what the text parses
into: content, reasoning and calls, with text that may begin a call held back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import RequestFault
from .logprobs import TokenLogprob
from .tools import Delta

if TYPE_CHECKING:
    from .tools.reader import OutputParser
    from .tools.types import ParsedOutput


class OutputPieces:
    """One request's log probabilities, and its output's parse as it streams."""

    def __init__(self, tool_parser: OutputParser | None, wants_logprobs: bool) -> None:
        self.tool_parser = tool_parser
        self.logprobs: list[TokenLogprob] | None = [] if wants_logprobs else None
        self._num_logprobs_streamed = 0  # of self.logprobs, how many went out with text pieces

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
