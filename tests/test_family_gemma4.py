"""The Gemma 4 family: its templates are detected, llama.cpp's own expected parses of its
output (tests/test-chat.cpp) come out the same whole and one character at a time, a call not
in the notation is content with an error, and a call cut off is dropped with an error; neither
is ever a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import TextDelta, output_parser, read_output
from multiseq.tools.families import detect, family_named
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
FAMILY = family_named("gemma4")
THINKING_OFF = "<|turn>model\n<|channel>thought\n<channel|>"  # the template's generation prompt


def read(text: str, prompt: str = THINKING_OFF, pieces: bool = False):
    return read_output(list(text) if pieces else text, "gemma4", prompt=prompt)


def summary(parsed) -> tuple:
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls])


@pytest.mark.parametrize("name", ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"])
def test_the_gemma_4_templates_are_detected(name):
    assert detect((TEMPLATES / name).read_text()).name == "gemma4"


def test_gemma_2_which_knows_no_tools_is_not_gemma_4():
    assert detect((TEMPLATES / "google-gemma-2-2b-it.jinja").read_text()).name != "gemma4"


HELLO = "Hello, world!\nWhat's up?"
LLAMA_CPP_CASES = [  # (test-chat.cpp line, output, content, reasoning, calls)
    (2994, "Hello, world!", "Hello, world!", None, []),
    (2998, "<|channel>thought\nI'm\nthinking<channel|>" + HELLO, HELLO, "I'm\nthinking", []),
    (3005, "<|channel>thought<channel|>" + HELLO, HELLO, None, []),
    (3019, '<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>', None, None,
     [("get_time", {"city": "London"})]),
    (3033, "<|tool_call>call:empty_args{}<tool_call|>", None, None, [("empty_args", {})]),
    (3040, HELLO + '<|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>', HELLO, None,
     [("get_time", {"city": "Paris"})]),
    (3055, '<|channel>thought\nI\'m\nthinking<channel|><|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>',
     None, "I'm\nthinking", [("get_time", {"city": "Paris"})]),
    (3067, '<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>'
           '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', None, None,
     [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})]),
    (3086, "<|tool_call>call:special_function{arg1:-7}<tool_call|>", None, None, [("special_function", {"arg1": -7})]),
    (3093, "<|tool_call>call:amount{orig:3.14}<tool_call|>", None, None, [("amount", {"orig": 3.14})]),
    (3107, "<|tool_call>call:toggle{enabled:false}<tool_call|>", None, None, [("toggle", {"enabled": False})]),
    (3114, "<|tool_call>call:set_nullable{value:null}<tool_call|>", None, None, [("set_nullable", {"value": None})]),
    (3121, '<|tool_call>call:todo_list{todos:[<|"|>buy milk<|"|>,<|"|>walk dog<|"|>]}<tool_call|>', None, None,
     [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    (3128, '<|tool_call>call:set_config{config:{theme:<|"|>dark<|"|>,count:3}}<tool_call|>', None, None,
     [("set_config", {"config": {"theme": "dark", "count": 3}})]),
    (3135, "<|tool_call>call:todo_list{todos:[]}<tool_call|>", None, None, [("todo_list", {"todos": []})]),
    (3149, "<|tool_call>call:amount{orig:1.5e10}<tool_call|>", None, None, [("amount", {"orig": 1.5e10})]),
    (3156, "<|channel>thought\n<channel|>" + HELLO + "<channel|>", HELLO, None, []),
    (3162, "<|channel>thought\n<channel|>" + HELLO + "<|channel>thought\n<channel|>", HELLO, None, []),
    (3168, "<|channel>thought\n<channel|>" + HELLO + "<|channel>thought\n<channel|><channel|>", HELLO, None, []),
    (3174, "<|channel><|channel>thought\n<channel|>" + HELLO, HELLO, None, []),
]


@pytest.mark.parametrize("line, text, content, reasoning, calls", LLAMA_CPP_CASES,
                         ids=[str(case[0]) for case in LLAMA_CPP_CASES])
def test_llama_cpps_expected_parses_whole_and_one_character_at_a_time(line, text, content, reasoning, calls):
    whole = read(text, prompt="<|turn>model\n")
    assert summary(whole) == (content, reasoning, calls)
    assert summary(read(text, prompt="<|turn>model\n", pieces=True)) == summary(whole)
    assert whole.error is None


def test_strings_hold_any_text_markers_included_and_keys_may_hold_spaces():
    text = ('<|tool_call>call:echo{text:<|"|>Wrap as <|tool_call>call:f{}<tool_call|>, {a:1}<|"|>, '
            'Basic LLM Chain:{main:[[1, 2]]}}<tool_call|>')
    for pieces in (False, True):
        assert summary(read(text, pieces=pieces)) == (None, None, [("echo", {
            "text": "Wrap as <|tool_call>call:f{}<tool_call|>, {a:1}", "Basic LLM Chain": {"main": [[1, 2]]}})])


def test_text_around_calls_is_content_in_order():
    text = 'Before <|tool_call>call:f{}<tool_call|> after'
    assert summary(read(text, pieces=True)) == ("Before  after", None, [("f", {})])


def test_a_prompt_that_opened_the_thought_channel_makes_the_output_start_as_reasoning():
    text = "The user wants the weather.<channel|>Sunny."
    for pieces in (False, True):
        assert summary(read(text, prompt="<|turn>model\n<|channel>thought\n", pieces=pieces)) == \
            ("Sunny.", "The user wants the weather.", [])


def test_an_output_cut_off_in_reasoning_is_all_reasoning():
    assert summary(read("<|channel>thought\nThe user wants", prompt="<|turn>model\n")) == \
        (None, "The user wants", [])


@pytest.mark.parametrize("text, content", [
    ('<|tool_call>call:get_weather{city:<|"|>Paris', None),
    ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>', None),
    ("<|tool_call>call:get", None),
    ('Let me check. <|tool_call>call:get_weather{city:<|"|>Par', "Let me check."),
])
def test_a_cut_off_call_is_dropped_with_an_error_never_a_call(text, content):
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert parsed.tool_calls == () and parsed.error == CUT_OFF
        assert parsed.content == content  # the text before the call; nothing of the call itself


def test_a_call_cut_off_after_whole_calls_is_dropped_and_the_whole_ones_kept():
    text = ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
            '<|tool_call>call:search{query:<|"|>caf')
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert summary(parsed) == (None, None, [("get_weather", {"city": "Paris"})]) and parsed.error == CUT_OFF


def test_an_output_ending_at_the_call_marker_leaves_no_marker_in_content():
    parsed = read("Let me check.<|tool_call>", pieces=True)
    assert summary(parsed) == ("Let me check.", None, []) and parsed.error == CUT_OFF


def test_a_call_not_in_the_notation_is_content_as_written():
    text = "<|tool_call>call:bad_func no brace<tool_call|>"
    parsed = read(text, pieces=True)
    assert parsed.tool_calls == () and parsed.content == text and "notation" in parsed.error


def test_a_whole_call_whose_closing_marker_never_came_is_still_a_call():
    assert summary(read("<|tool_call>call:f{a:1}")) == (None, None, [("f", {"a": 1})])


def test_no_marker_is_ever_streamed_as_content():
    text = 'I will check.<|tool_call>call:f{a:<|"|>x<|"|>}<tool_call|><|channel>thought\nhm<channel|>Done.'
    shown = ""
    parser = output_parser("gemma4", prompt=THINKING_OFF)
    for char in text:
        shown += "".join(delta.text for delta in parser.feed(char) if isinstance(delta, TextDelta))
        assert not any(marker in shown for marker in FAMILY.markers), shown
    parser.close()
    assert summary(parser.result()) == ("I will check.Done.", "hm", [("f", {"a": "x"})])
