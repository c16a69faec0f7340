"""What the engine does with a request's tools: render them, constrain the calls, parse them.

One ToolSupport per engine, fixed by the model's chat template (or --tool-format): which format
the model writes calls in, whether its template renders tools itself, and whether it reasons
in <think>...</think> first.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from .grammars import tool_grammar
from .prompts import detect_format, generic_messages, native_messages, thinks
from .types import ToolFormat

if TYPE_CHECKING:
    from ..batch import Backend
    from .parsers import ToolCallParser
    from ..request import Request


def new_call_id(index: int) -> str:
    """A call's id, as OpenAI writes them; the parser asks once per call and keeps it."""
    return f"call_{secrets.token_hex(12)}"


class ToolSupport:
    """The tool-call format of one model, and the rendering, grammar and parser it implies."""

    def __init__(self, template_source: str | None, tool_format: ToolFormat | str | None = None) -> None:
        detected = detect_format(template_source)
        self.format = ToolFormat(tool_format) if tool_format is not None else detected
        # The template renders tools itself only in the format it was written for.
        self.is_native = self.format is not ToolFormat.GENERIC and detected is self.format
        self.reasons = thinks(template_source)

    def render(self, backend: Backend, request: Request) -> str:
        """The prompt of a chat request: the template's own rendering where the request has
        neither tools nor tool messages, else with tools in this model's way (prompts.py)."""
        messages = request.messages
        if not request.tools and not any(message["role"] == "tool" or message.get("tool_calls")
                                         for message in messages):
            return backend.render_chat(messages)
        if self.is_native:
            tools = [tool.openai() for tool in request.tools or ()]
            return backend.render_chat(tuple(native_messages(messages)), tools=tools)
        return backend.render_chat(tuple(generic_messages(messages, request.tools, self.format)))

    def grammar(self, request: Request) -> str | None:
        """The grammar of the request's calls (None when it may make none)."""
        if not request.uses_tools:
            return None
        return tool_grammar(request.tools, request.effective_tool_choice, request.parallel_tool_calls, self.format,
                            reasoning=self.reasons)

    def parser(self, request: Request) -> ToolCallParser | None:
        """A parser of the output into content, reasoning and calls, for a request that may
        call tools or whose model reasons (None: the output is plain text)."""
        if request.messages is None or not (request.uses_tools or self.reasons):
            return None
        from .parsers import ToolCallParser  # noqa: PLC0415 - lands with the parsers of each format
        return ToolCallParser(self.format if request.uses_tools else None, new_call_id, parse_reasoning=self.reasons)
