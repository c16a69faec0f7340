"""The Hermes family (read by multiseq.tools.parsers): its templates are detected, llama.cpp's
own expected parses (tests/test-chat.cpp) come out the same whole and one character at a time,
and a cut-off call is never a call: dropped with an error (whole calls before it stand), never
streamed before it ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import ToolFormat, output_parser, read_output
from multiseq.tools.families import detect
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"


def read(text: str, pieces: bool = False):
    return read_output(list(text) if pieces else text, "hermes")


def summary(parsed) -> tuple:
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls])


@pytest.mark.parametrize("name", ["NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
                                  "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
                                  "Qwen-Qwen3-0.6B.jinja"])
def test_the_hermes_templates_are_detected(name):
    assert detect((TEMPLATES / name).read_text()).name == "hermes"


HELLO = "Hello, world!\nWhat's up?"
ARG1 = ("special_function", {"arg1": 1})
LLAMA_CPP_CASES = [  # (test-chat.cpp line, output, content, reasoning, calls)
    (3332, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>', None, None, [ARG1]),
    (3340, HELLO + '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>', HELLO, None,
     [ARG1]),
    (6106, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>', None, None, [ARG1]),
    (6105, HELLO, HELLO, None, []),
    # Reka Edge (a hermes template) with thinking on: its prompt opened <think>.
    (6128, "I'm\nthinking\n</think>\n\n" + HELLO, HELLO, "I'm\nthinking", []),
]


@pytest.mark.parametrize("line, text, content, reasoning, calls", LLAMA_CPP_CASES,
                         ids=[str(case[0]) for case in LLAMA_CPP_CASES])
def test_llama_cpps_expected_parses_whole_and_one_character_at_a_time(line, text, content, reasoning, calls):
    whole = read(text)
    assert summary(whole) == (content, reasoning, calls) and whole.error is None
    assert summary(read(text, pieces=True)) == summary(whole)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris',
    '<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city',
    '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',  # no closing brace
])
def test_a_cut_off_call_is_dropped_with_an_error_never_a_call(text):
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert parsed.tool_calls == () and parsed.error == CUT_OFF
        assert parsed.content is None  # neither <tool_call> nor the call as written


def test_a_call_cut_off_after_a_whole_one_is_dropped_and_the_whole_one_kept():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "search", "arguments": {"query": "café')
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert summary(parsed) == (None, None, [("get_weather", {"city": "Zürich"})]) and parsed.error == CUT_OFF


def test_no_call_is_streamed_before_it_ends():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parser = output_parser(ToolFormat.HERMES, call_id=lambda index: f"call_{index}")
    assert [delta for char in text[:-1] for delta in parser.feed(char)] == []
    assert len(parser.feed(text[-1])) == 2  # the call's start and its whole arguments


def test_a_prompt_that_opened_think_makes_an_output_cut_off_in_it_all_reasoning():
    """Qwen3-Thinking-2507's prompt ends with <think>. (Through read_output this needs the
    framework to pass the prompt's open block to the parser: see new_parser.)"""
    for pieces in (["The user wants the current weather"], list("The user wants the current weather")):
        parser = output_parser(ToolFormat.HERMES, call_id=lambda index: f"call_{index}", prompt="<think>\n")
        for piece in pieces:
            parser.feed(piece)
        parser.close()
        assert summary(parser.result()) == (None, "The user wants the current weather", [])
