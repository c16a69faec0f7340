"""Checks shared by the tests of the XML-tag call families (qwen3-xml, minimax-m2, seed-oss):
llama.cpp's test tools, and a text read whole, one character at a time and in random pieces
giving the same result, with no marker of the family in content or reasoning."""

from __future__ import annotations

import json
from pathlib import Path

from multiseq.tools import ReasoningDelta, TextDelta, Tool, output_parser, read_output
from marked_family_checks import random_pieces
from multiseq.tools.families import detect, family_named

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"


def _tool(name: str, properties: dict, required: tuple[str, ...] = ()) -> Tool:
    return Tool(name, None, {"type": "object", "properties": properties, "required": list(required)})


# llama.cpp's test tools (tests/test-chat.cpp:425-870), the ones the copied cases call.
STRING, INTEGER = {"type": "string"}, {"type": "integer"}
TOOLS = (
    _tool("special_function", {"arg1": INTEGER}, ("arg1",)),
    _tool("special_function_with_opt", {"arg1": INTEGER, "arg2": INTEGER}, ("arg1",)),
    _tool("empty_args", {}),
    _tool("python", {"code": STRING}, ("code",)),
    _tool("html", {"markup": STRING}, ("markup",)),
    _tool("todo_list", {"todos": {"type": "array"}}, ("todos",)),
    _tool("edit", {"filename": STRING, "oldString": STRING, "newString": STRING}),
    _tool("run_in_terminal", {"command": STRING}, ("command",)),
    _tool("magic", {"name": STRING, "ref": STRING}),
    _tool("set_nullable_str", {"name": {"type": ["string", "null"]}}),
    _tool("set_nullable_int", {"count": {"type": ["integer", "null"]}}),
    _tool("set_union", {"value": {"type": ["string", "object"]}, "amount": {"type": ["string", "integer"]}}),
    _tool("set_unit", {"unit": {"enum": ["celsius", "fahrenheit"]}}),
    _tool("set_alarm", {"hour": INTEGER, "repeat": {"type": "boolean"}, "label": {"type": ["string", "null"]}}),
)


def detected(name: str) -> str:
    return detect((TEMPLATES / name).read_text()).name


def calls_of(parsed) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls]


def summary(parsed) -> tuple:
    return parsed.content, parsed.reasoning, calls_of(parsed), parsed.error


def streamed(family: str, pieces: list[str], prompt: str = ""):
    """(the result, the content and reasoning shown before the output ended)."""
    parser = output_parser(family, tools=TOOLS, prompt=prompt)
    early = [delta for piece in pieces for delta in parser.feed(piece)]
    late = parser.close()
    result = parser.result()
    content = "".join(delta.text for delta in early + late if isinstance(delta, TextDelta))
    reasoning = "".join(delta.text for delta in early + late if isinstance(delta, ReasoningDelta))
    assert ((content or None), (reasoning or None)) == (result.content, result.reasoning)
    shown = "".join(delta.text for delta in early if isinstance(delta, (TextDelta, ReasoningDelta)))
    return result, shown


def read_everywhere(text: str, family: str, prompt: str = "", markers_are_text: bool = False):
    """`text` read whole and streamed (one character at a time, random pieces): the same result
    each time (returned); no marker in what a stream showed early, nor in the content and
    reasoning unless the result is an error (whose content is the raw text) or the test says
    the markers are text (`markers_are_text`)."""
    whole = read_output(text, family, tools=TOOLS, prompt=prompt)
    markers = () if markers_are_text else family_named(family).markers
    for pieces in [list(text)] + [random_pieces(text, seed) for seed in (1, 2, 3)]:
        result, shown = streamed(family, pieces, prompt)
        assert summary(result) == summary(whole), pieces
        assert not any(marker in shown for marker in markers), shown
    if whole.error is None:
        for part in (whole.content or "", whole.reasoning or ""):
            assert not any(marker in part for marker in markers), part
    return whole

