"""Checks shared by the tests of the families whose calls sit in marked sections (Granite,
Command R7B, Functionary, LFM2, Apertus): a text read whole and streamed in pieces gives the
same result, and the markers never reach content, reasoning or arguments."""

from __future__ import annotations

import json
import random
from pathlib import Path

from multiseq.tools import ArgumentsDelta, ReasoningDelta, TextDelta, Tool, output_parser, read_output
from multiseq.tools.families import detect, family_named

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"

# llama.cpp's test tools (tests/test-chat.cpp), the ones the copied cases call.
SPECIAL_FUNCTION = Tool("special_function", "I'm special", {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]})
SPECIAL_FUNCTION_WITH_OPT = Tool("special_function_with_opt", "I'm special but have optional stuff", {
    "type": "object", "properties": {"arg1": {"type": "integer"}, "arg2": {"type": "integer"}}, "required": ["arg1"]})
PYTHON = Tool("python", "an ipython interpreter", {
    "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
GET_TIME = Tool("get_time", "Get the current time in a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TOOLS = (SPECIAL_FUNCTION, SPECIAL_FUNCTION_WITH_OPT, PYTHON, GET_TIME)


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def detected(name: str) -> str:
    return detect(template(name)).name


def calls_of(parsed) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls]


def summary(parsed) -> tuple:
    return parsed.content, parsed.reasoning, calls_of(parsed), parsed.error


def streamed(text: str, family: str, pieces: list[str], tools=TOOLS, prompt: str = ""):
    """The pieces through one streaming parser, accumulated as a client accumulates deltas:
    (content, reasoning, calls, error, the text shown before the end)."""
    parser = output_parser(family, tools=tools, prompt=prompt)
    early = [delta for piece in pieces for delta in parser.feed(piece)]
    late = parser.close()
    content = "".join(delta.text for delta in early + late if isinstance(delta, TextDelta))
    reasoning = "".join(delta.text for delta in early + late if isinstance(delta, ReasoningDelta))
    arguments = "".join(delta.text for delta in early + late if isinstance(delta, ArgumentsDelta))
    result = parser.result()
    assert (content or None) == result.content and (reasoning or None) == result.reasoning
    assert arguments == "".join(call.arguments for call in result.tool_calls)
    shown = "".join(delta.text for delta in early if isinstance(delta, (TextDelta, ReasoningDelta)))
    return result, shown


def read_everywhere(text: str, family: str, tools=TOOLS, prompt: str = "", markers_expected: bool = False):
    """`text` read whole, one character at a time and in random pieces: the same result each
    time (returned), and no marker of the family in content, reasoning or arguments (unless
    the result is an error, whose content is the raw text, or the expected parse has them)."""
    whole = read_output(text, family, tools=tools, prompt=prompt)
    splits = [list(text)] + [random_pieces(text, seed) for seed in (1, 2, 3)]
    for pieces in splits:
        result, shown = streamed(text, family, pieces, tools, prompt)
        assert summary(result) == summary(whole), pieces
        for marker in family_named(family).markers:
            assert marker not in shown or whole.error or markers_expected, (marker, shown)
    if whole.error is None and not markers_expected:
        assert_no_markers(whole, family)
    return whole


def assert_no_markers(parsed, family: str) -> None:
    for marker in family_named(family).markers:
        for text in [parsed.content or "", parsed.reasoning or ""] + [call.arguments for call in parsed.tool_calls]:
            assert marker not in text, (marker, text)


def random_pieces(text: str, seed: int) -> list[str]:
    """`text` cut into pieces of 1 to 8 characters, at seeded random points."""
    chooser = random.Random(seed)
    pieces, position = [], 0
    while position < len(text):
        size = chooser.randint(1, 8)
        pieces.append(text[position:position + size])
        position += size
    return pieces
