"""The one entry point that reads a model's output into content, reasoning and calls.

The engine and the tests use the same calls: `output_parser` for a stream (feed each piece, then
close), `read_output` for a whole text or a list of pieces. The family is given by name, as a
Family, or found from a chat template; `prompt` is the rendered prompt (or its end), which says
whether the output starts inside a reasoning block the template opened.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable, Sequence

from .families import detect, family_named
from .family import Family, ParseContext
from .reader import OutputParser
from .types import ParsedOutput, Tool


# Every reader checks its stream against the whole text after each piece (the families' claims
# about their formats, reader.py): for the tests, which set it; quadratic, never for serving.
VERIFY = os.environ.get("MULTISEQ_VERIFY_READER") == "1"


def new_call_id(index: int) -> str:
    """A call's id, as OpenAI writes them; the parser asks once per call and keeps it."""
    return f"call_{secrets.token_hex(12)}"


def family_of(family: Family | str | None = None, template: str | None = None) -> Family:
    if isinstance(family, Family):
        return family
    if family is not None:
        return family_named(family)
    return detect(template)


def output_parser(family: Family | str | None = None, *, template: str | None = None, tools: Sequence[Tool] = (),
                  prompt: str = "", variant: str | None = None,
                  call_id: Callable[[int], str] = new_call_id, reasons: bool | None = None) -> OutputParser:
    """A streaming parser of one output: `feed(piece)` and `close()` return deltas
    (TextDelta, ReasoningDelta, ToolCallStart, ArgumentsDelta), then `result()` the ParsedOutput.
    `reasons`: whether the model reasons, where the template says (None: where its family does)."""
    chosen = family_of(family, template)
    thinks = chosen.reasoning is not None if reasons is None else reasons
    context = ParseContext(final=False, tools={tool.name: tool for tool in tools},
                           reasoning_open=chosen.opens_reasoning(prompt),
                           variant=variant or chosen.variant_of(template), reasons=thinks)
    return OutputParser(chosen, call_id, context, verify=VERIFY)


def read_output(output: str | Iterable[str], family: Family | str | None = None, *, template: str | None = None,
                tools: Sequence[Tool] = (), prompt: str = "", variant: str | None = None,
                call_id: Callable[[int], str] = new_call_id, reasons: bool | None = None) -> ParsedOutput:
    """A whole output (a text, or the pieces it streamed in) read at once."""
    parser = output_parser(family, template=template, tools=tools, prompt=prompt, variant=variant, call_id=call_id,
                           reasons=reasons)
    for piece in [output] if isinstance(output, str) else output:
        parser.feed(piece)
    parser.close()
    return parser.result()
