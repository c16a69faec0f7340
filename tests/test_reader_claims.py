"""The one reader (runner/tools/reader.py) on every family: a stream read piece by piece, going
on from where each parse left off and skipping the parses its family says cannot change
anything, reads exactly as the whole text read at once, however the text is cut.

The readers here check that after every piece (`verify=True`: what went out begins what the
whole text gives so far, and is all of it once closed), so a family whose claims about its
format are wrong (a resume point that is not one, a stop string it forgot) fails here, on text
made of its own markers, its call syntax and the characters its formats turn on.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multiseq.tools import ParseContext, Tool
from multiseq.tools.families import all_families
from multiseq.tools.reader import OutputParser
from multiseq.tools.reading import read_output

TOOLS = {"get_weather": Tool("get_weather", None, {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}})}
# What formats turn on besides their markers: JSON, XML-like tags, line starts, quotes, escapes.
COMMON = ["\n", " ", "  ", "\t", "{", "}", "[", "]", '"', "\\", ":", ",", ";", "<", ">", "=", "/", "|", "`", "'",
          "(", ")", "Action:", "```json", "get_weather", '"name"', '"arguments"', '"parameters"', '"city"',
          '"Paris"', "city", "Paris", "7", "true", "null", "hello world", "é", "😀", "functions.", ":0",
          '{"city": "Paris"}', '"get_weather"', "<tool_call>", "</tool_call>", "<think>", "</think>",
          "<function=", "<parameter=", "</parameter>", "</function>", '"response"', '"tool_calls"', "to=functions.",
          ">>>", "all\n", "functools", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "<|im_end|>"]


def family_soup(family) -> list[str]:
    """The strings an output of `family` is made of here: its markers, the pieces of its call
    syntax, and the common characters."""
    pieces = set(family.markers) | set(family.reasoning or ())
    for syntax in (family.call_syntax, *family.variant_call_syntax.values()):
        if syntax is None:
            continue
        for part in (syntax.call_open, syntax.call_close, syntax.block_open, syntax.block_close, syntax.separator,
                     syntax.parameter_open or "", syntax.parameter_close, *(syntax.reasoning or ())):
            pieces.add(part.replace("{name}", "get_weather").replace("{index}", "0").replace("{key}", "city")
                       .replace("{string}", "true"))
    return sorted(piece for piece in pieces | set(COMMON) if piece)


def read_in_pieces(family, text: str, cuts: list[int], reasoning_open: bool, reasons: bool):
    context = ParseContext(final=False, tools=TOOLS, reasoning_open=reasoning_open, reasons=reasons)
    parser = OutputParser(family, lambda index: f"call_{index}", context, verify=True)
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        parser.feed(text[start:end])
    parser.close()
    return parser.result()


FAMILIES = all_families()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_stream_cut_anywhere_reads_as_its_whole_text(family, data):
    soup = family_soup(family)
    text = "".join(data.draw(st.lists(st.sampled_from(soup), max_size=40), label="text"))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=20), label="cuts"))
    reasoning_open = data.draw(st.booleans(), label="reasoning_open") and family.reasoning is not None
    reasons = data.draw(st.booleans(), label="reasons")
    read_in_pieces(family, text, cuts, reasoning_open, reasons)  # verify=True checks every piece


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_a_stream_one_character_at_a_time_reads_as_its_whole_text(family):
    """Long runs of plain text between markers (where the reader skips parses) and the markers
    cut at every character."""
    line = "A line of plain text, long enough to be taken without a parse.\n"
    prose = line * 3
    soup = family_soup(family)
    text = prose + line.join(soup[::3]) + prose + "".join(soup[1::3]) + prose
    read_in_pieces(family, text, list(range(1, len(text))), reasoning_open=False, reasons=True)
    read_in_pieces(family, text, list(range(1, len(text))), reasoning_open=family.reasoning is not None,
                   reasons=True)


def test_a_wrong_claim_is_caught():
    """The check itself: a family that says plain text grows its content until a stop it
    does not honour (it reads "!" as the end of content) reads differently streamed, and
    verify=True says so."""
    from multiseq.tools.family import CONTENT, Family, FamilyParse, Open, Text

    def parse(text, context):
        shown = text.split("!")[0]
        return FamilyParse((Text(shown),), open=Open(len(text), CONTENT, Text, ("?",)))

    family = Family(name="wrong", description="", parse=parse)
    with pytest.raises(AssertionError, match="streamed content"):
        read_in_pieces(family, "abc!def", [1, 4], reasoning_open=False, reasons=False)
    assert read_output("abc!def", family).content == "abc"
