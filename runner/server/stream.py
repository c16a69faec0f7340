"""A streamed answer as typed events: what the model wrote (text, reasoning, the start of a call,
a piece of a call's arguments), how each choice ended, the usage, or the failure.

The engine hands out each piece of text with what its family's reader parsed it into
(multiseq.tools: TextDelta, ReasoningDelta, ToolCallStart, ArgumentsDelta); `CompletionCall.events`
turns the pieces into these events, and Responses renders its output items from them, Messages
its content blocks. Chat Completions renders its chunks from the pieces themselves
(`CompletionCall.chunks`: a chunk also carries a piece's log probabilities and a completion's
echoed prompt, which these events do not), through the same failure path. So reasoning and calls
are carried the same way everywhere, and no API reads another's wire format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..tools import ArgumentsDelta, ReasoningDelta, TextDelta, ToolCallStart


@dataclass(frozen=True)
class TextPart:
    """Text of the answer (content)."""

    choice: int
    text: str


@dataclass(frozen=True)
class ReasoningPart:
    """Text of the model's reasoning."""

    choice: int
    text: str


@dataclass(frozen=True)
class CallBegins:
    """Call `index` of the choice begins: its id and the function's name."""

    choice: int
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPart:
    """A piece of call `index`'s arguments (JSON text; the pieces joined are the arguments)."""

    choice: int
    index: int
    text: str


@dataclass(frozen=True)
class ChoiceEnds:
    """The choice ended: why (the chat layer's finish_reason) and the stop string that ended it."""

    choice: int
    finish_reason: str
    stop_string: str | None = None


@dataclass(frozen=True)
class UsageKnown:
    """The answer's token usage, in Chat Completions' names (each API converts it)."""

    usage: dict[str, Any]


@dataclass(frozen=True)
class StreamFails:
    """A choice failed: the error body a client gets (the stream ends here)."""

    body: dict[str, Any]

    @property
    def message(self) -> str | None:
        return (self.body.get("error") or {}).get("message")


StreamEvent = TextPart | ReasoningPart | CallBegins | ArgumentsPart | ChoiceEnds | UsageKnown | StreamFails


def piece_events(choice: int, text: str, deltas: tuple | None) -> list[StreamEvent]:
    """The events of one piece of a choice's output: what its reader parsed it into (none while
    text is held back), or its text where the output is not parsed (`deltas` None)."""
    if deltas is None:
        return [TextPart(choice, text)] if text else []
    events: list[StreamEvent] = []
    for delta in deltas:
        if isinstance(delta, TextDelta):
            events.append(TextPart(choice, delta.text))
        elif isinstance(delta, ReasoningDelta):
            events.append(ReasoningPart(choice, delta.text))
        elif isinstance(delta, ToolCallStart):
            events.append(CallBegins(choice, delta.index, delta.id, delta.name))
        elif isinstance(delta, ArgumentsDelta):
            events.append(ArgumentsPart(choice, delta.index, delta.text))
    return events
