"""The plain types of tool calling, shared by the engine, the formats and the three APIs.

A request offers `tools` (functions with JSON-schema parameters) and a `ToolChoice`; the model
writes calls in its family's format (ToolFormat); the parser turns the text it writes into
`Delta`s as it streams (text, reasoning, the start of a call, pieces of a call's arguments)
and, at the end, into a `ParsedOutput`: the content, the reasoning and the `ToolCall`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class ToolFormat(str, Enum):
    """How a model family writes tool calls (llama.cpp's names where it has one)."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes 2 Pro, Qwen 2.5/3)
    LLAMA3 = "llama3"  # [<|python_tag|>]{"name": ..., "parameters": {...}} (Llama 3.1-3.3)
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral Nemo, Small)
    # Templates that know no tools: the tools described in a system part, and the call written
    # as {"tool_calls": [{"name": ..., "arguments": {...}}]} (llama.cpp's "Generic" format).
    GENERIC = "generic"


class ChoiceMode(str, Enum):
    AUTO = "auto"  # the model chooses: text, or calls
    NONE = "none"  # no call: text only (the tools are still described in the prompt)
    REQUIRED = "required"  # at least one call, from the first token
    FUNCTION = "function"  # exactly one call of the named function, from the first token


@dataclass(frozen=True)
class ToolChoice:
    mode: ChoiceMode = ChoiceMode.AUTO
    name: str | None = None  # the function, for ChoiceMode.FUNCTION

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ChoiceMode(self.mode))
        if (self.mode is ChoiceMode.FUNCTION) != (self.name is not None):
            raise ValueError("tool_choice names a function exactly when its mode is 'function'")

    @property
    def forces_call(self) -> bool:
        return self.mode in (ChoiceMode.REQUIRED, ChoiceMode.FUNCTION)


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, and its arguments' JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of an object; None: no arguments
    strict: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tool needs a non-empty name, got {self.name!r}")
        if self.parameters is not None and not isinstance(self.parameters, dict):
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema object")

    @property
    def schema(self) -> dict[str, Any]:
        """The arguments' schema, an empty object's when the tool takes none."""
        return self.parameters if self.parameters is not None else {"type": "object", "properties": {}}

    def openai(self) -> dict[str, Any]:
        """The tool as OpenAI's API and Hugging Face chat templates write it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.schema
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: its id, the function's name, the arguments as JSON text."""

    id: str
    name: str
    arguments: str


# --- what a parser hands out while the text streams -------------------------------------------

@dataclass(frozen=True)
class TextDelta:
    """Text meant for the user (`content`); never text that may still turn out to be a call."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Text the model wrote inside <think>...</think> (`reasoning_content`)."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call begins: its index among this output's calls, its id and the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """A piece of call `index`'s arguments (JSON text); the pieces joined are the arguments."""

    index: int
    text: str


Delta = TextDelta | ReasoningDelta | ToolCallStart | ArgumentsDelta


@dataclass(frozen=True)
class ParsedOutput:
    """A whole output, parsed: what the deltas add up to.

    `content` is None when the output holds only calls (OpenAI's message.content is then
    null). `error` says why text that began a call could not be read as one (malformed JSON
    from an unconstrained model); the text is then kept as content, never dropped."""

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    error: str | None = None
