"""What a step hands out: text pieces to stream (with their log probabilities and, for an
output that is read, what they read into), and the results of the requests that ended."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..sampling.logprobs import TokenLogprob
from .pieces import OutputPieces
from ..request import Result
from ..tools import Delta, TextDelta


@dataclass(frozen=True)
class TextPiece:
    """Text a request produced in one step, ready to stream, with the log probabilities of
    the tokens behind it when the request asked for them (a token whose text was held back,
    say as a possible stop string's start, comes with the piece that releases text)."""

    request_id: str
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    # With tools (or a model that reasons): the output the piece is part of (read when its
    # deltas are first asked: multiseq.loop.pieces), how many of its parts were made up to the piece,
    # and whether the piece ends it; None for an output of plain text.
    output: OutputPieces | None = None
    num_parts: int = 0
    is_last: bool = False
    # A scored prompt's (echo with logprobs) first piece: the prompt's first token and the log
    # probabilities of the others, computed by then, so that a stream can echo the prompt first.
    prompt_first_token: bytes = b""
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    @functools.cached_property
    def deltas(self) -> tuple[Delta, ...] | None:
        """The text parsed into content, reasoning and calls (multiseq.tools.types' deltas), text
        that may begin a call held back; None for a request whose output is plain text. Read on
        the asking thread, at the first ask: the deltas of the output up to this piece that no
        earlier piece's ask was handed."""
        return None if self.output is None else self.output.deltas_until(self.num_parts, close=self.is_last)

    @property
    def parsed(self) -> tuple[Delta, ...]:
        """What the piece reads as: its deltas, or for plain text its text as one TextDelta."""
        if self.deltas is not None:
            return self.deltas
        return (TextDelta(self.text),) if self.text else ()


@dataclass
class StepOutput:
    """What happened since the last take_output(): text pieces in the order they were made,
    then the results of the requests that ended. A request's pieces come before its result."""

    pieces: list[TextPiece] = field(default_factory=list)
    finished: list[Result] = field(default_factory=list)
    num_tokens_decoded: int = 0  # 0: no batch was decoded

    def __bool__(self) -> bool:
        return bool(self.pieces or self.finished or self.num_tokens_decoded)
