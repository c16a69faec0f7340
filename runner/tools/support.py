"""What the engine does with a request's tools: render them, constrain the calls, parse them.

One ToolSupport per engine, fixed by the model's chat template (or --tool-format): the family the
model writes calls and reasoning in (multiseq.tools.families), whether its template renders tools
itself, and the control tokens its parser must see as text.
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING

from .families import detect, family_named
from .family import Family
from .grammars import family_grammar
from .prompts import call_id_of_length, generic_messages, thinks, with_call_ids_of_length
from .reading import new_call_id, output_parser
from .types import ToolFormat

if TYPE_CHECKING:
    from ..llama.batch import Backend
    from ..request import Request

__all__ = ["ToolSupport", "new_call_id"]


class ToolSupport:
    """The tool-call and reasoning family of one model, and the rendering, grammar and parser
    it implies."""

    def __init__(self, template_source: str | None, tool_format: str | None = None,
                 split_reasoning: bool = True) -> None:
        self.detected = detect(template_source)
        self.family: Family = family_named(tool_format) if tool_format is not None else self.detected
        # The JSON-call formats can be written into a prompt as text (prompts.py); every other
        # family is known from its template, which renders its tools.
        self.format = ToolFormat(self.family.legacy_format) if self.family.legacy_format else None
        self.is_native = self.format is None or (self.format is not ToolFormat.GENERIC and self.detected is self.family)
        # A family over the first parser reasons only where the template says so (Qwen3 does,
        # Qwen 2.5 does not: holding text back for a </think> that never comes would delay it).
        self.reasons = split_reasoning and (thinks(template_source) if self.format is not None
                                            else self.family.reasoning is not None)
        self.variant = self.family.variant_of(template_source)
        self.special_markers: dict[str, int] = {}  # the family's markers that are control tokens (marker_tokens)

    def described(self) -> dict:
        """The family as /props and `multiseq info MODEL` show it: its name, what it writes, its
        reasoning markers, and the family the template was detected as (--tool-format may differ)."""
        family = self.family
        return {"name": family.name, "description": family.description,
                "reasoning": list(family.reasoning) if family.reasoning else None, "detected": self.detected.name}

    def render(self, backend: Backend, request: Request, now: datetime.datetime | None = None) -> str:
        """The prompt of a chat request, rendered as llama-server renders it: a template that
        knows tools gets the messages as they are (calls, results, reasoning) and the tools when
        there are some, so a conversation's prompt is the same with or without them; any other
        template gets the generic format (prompts.py)."""
        messages, options = request.messages, dict(request.template_options or {})
        if self.family.call_id_length is not None:
            messages = tuple(with_call_ids_of_length(messages, self.family.call_id_length))
        template = self.detected
        shaping = {"adjust": self._adjustment(backend, request.tools),
                   "keeps_developer_role": template.keeps_developer_role, "now": now}
        if self.is_native:
            tools = [tool.openai() for tool in request.tools] if request.tools else None
            prompt = backend.render_chat(messages, tools=tools, options=options, **shaping)
        else:
            prompt = backend.render_chat(tuple(generic_messages(messages, request.tools, self.format)),
                                         options=options, **shaping)
        return template.finish_prompt(prompt) if template.finish_prompt is not None else prompt

    def _adjustment(self, backend: Backend, tools=()):
        """The detected family's own shaping of the messages for its template (None: none), and
        the tools put in the system message for a template that reads them there."""
        adjust, source = self.detected.template_messages, backend.chat_template_source
        in_system = tools_in_system_message(tools) if tools and self.detected.tools_in_system else None
        if (adjust is None or source is None) and in_system is None:
            return None

        def adjusted(messages: list[dict]) -> list[dict]:
            if adjust is not None and source is not None:
                messages = adjust(messages, source)
            return messages if in_system is None else in_system(messages)
        return adjusted

    def grammar(self, request: Request, prompt: str = "") -> str | None:
        """The grammar of the request's calls (None when it may make none, or when the family
        has no grammar: its calls are then read as the model writes them)."""
        if not request.uses_tools:
            return None
        syntax = self.family.syntax_for(self.variant)
        if syntax is None:
            return None
        # The syntax's own reasoning block where it has one (the JSON-call formats' <think>).
        reasoning = (syntax.reasoning or self.family.reasoning) if self.reasons else None
        return family_grammar(request.tools, request.effective_tool_choice, request.parallel_tool_calls, syntax,
                              self.special_markers, reasoning,
                              reasoning_open=reasoning is not None and self.family.opens_reasoning(prompt))

    def parser(self, request: Request, prompt: str = ""):
        """A parser of the output into content, reasoning and calls (None: the output is plain
        text): for a request that may call tools, and for any chat with a model that reasons."""
        reads_reasoning = self.reasons and request.messages is not None and request.prompt is None
        if not request.uses_tools and not reads_reasoning:
            return None
        call_id = new_call_id if self.family.call_id_length is None else call_id_of_length(self.family.call_id_length)
        return output_parser(self.family, tools=request.tools or (), prompt=prompt, variant=self.variant,
                             call_id=call_id, reasons=self.reasons)

    def marker_tokens(self, backend: Backend) -> dict[int, bytes]:
        """The control tokens that are the family's markers, with their text: llama.cpp renders
        control tokens as nothing, but the parser must see these (gpt-oss's <|channel|>, Kimi's
        sections, DeepSeek's call markers where they are special tokens)."""
        found: dict[int, bytes] = {}
        for marker in self.family.markers:
            tokens = backend.tokenize(marker, add_special=False)
            if len(tokens) == 1 and not backend.token_bytes(tokens[0]):
                found[tokens[0]] = marker.encode("utf-8")
        self.special_markers = {text.decode("utf-8"): token for token, text in found.items()}
        return found


def tools_in_system_message(tools):
    """A shaping that gives the system message (a new one first where there is none) the tools
    as `tools`, the JSON text of their functions, as Phi-4-mini's template reads them."""
    text = json.dumps([tool.openai()["function"] for tool in tools], ensure_ascii=False)

    def shaped(messages: list[dict]) -> list[dict]:
        if messages and messages[0]["role"] == "system":
            return [messages[0] | {"tools": text}, *messages[1:]]
        return [{"role": "system", "content": "", "tools": text}, *messages]
    return shaped
