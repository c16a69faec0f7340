"""The Llama family: Llama 3.1-3.3's templates are detected, llama.cpp's expected parse
(tests/test-chat.cpp) and CanIToolCall's recorded Llama outputs come out the same whole and one
character at a time -- Llama 3's JSON calls, bare or after <|python_tag|> (which may follow
text), Llama 3.1's built-in tools (`brave_search.call(query=...)`), and Llama 4's pythonic
`[f(a=1), g()]` -- and a cut-off call is never a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import read_output
from multiseq.tools.families import detect, family_named
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"


def read(text: str, pieces: bool = False):
    return read_output(list(text) if pieces else text, "llama3")


def summary(parsed) -> tuple:
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls])


@pytest.mark.parametrize("name", ["meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
                                  "meta-llama-Llama-3.3-70B-Instruct.jinja"])
def test_the_llama_3_templates_are_detected(name):
    assert detect((TEMPLATES / name).read_text()).name == "llama3"


def test_llama_4s_template_is_known_by_its_ipython_header():
    # The tool turn's header of Meta's Llama 4 template (it is not among llama.cpp's templates).
    assert family_named("llama3").matches('{{- "<|header_start|>ipython<|header_end|>\\n\\n" }}')


CASES = [  # (where the expected parse comes from, output, content, calls)
    ("test-chat.cpp:6301", "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("llama/l3-single-call", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None,
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("llama/l3-sglang-python-tag-call", '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Beijing"}}', None,
     [("get_weather", {"city": "Beijing"})]),
    ("llama/l3-sglang-text-before-python-tag",
     'Let me check. <|python_tag|>{"name": "get_weather", "arguments": {"city": "Tokyo"}}', "Let me check.",
     [("get_weather", {"city": "Tokyo"})]),
    ("llama/l3-bug-leading-json-object-in-content", '{"a": 1} is a dict', '{"a": 1} is a dict', []),
    ("llama/l4-vllm-pythonic-more-types",
     "[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, passed_test=True, "
     "aliases=['John', 'Johnny'])]", None,
     [("register_user", {"name": "Doe", "age": 9, "address": {"city": "LA", "state": "CA"}, "role": None,
                         "passed_test": True, "aliases": ["John", "Johnny"]})]),
    ("llama/l4-vllm-pythonic-parameterless", "[get_weather()]", None, [("get_weather", {})]),
    ("llama/l4-vllm-pythonic-escaped-strings",
     "[get_weather(city='Martha\\'s Vineyard', metric='\\\"cool units\\\"')]", None,
     [("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})]),
    ("llama/l4-vllm-pythonic-parallel-no-spaces", "[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9)]",
     None, [("get_weather", {"city": "LA", "metric": "C"}), ("register_user", {"name": "Doe", "age": 9})]),
    ("llama/l4-vllm-pythonic-python-start-end", "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>",
     None, [("get_weather", {"city": "LA", "metric": "C"})]),
    ("llama/l4-bug-leading-underscore-identifier", "[search(_limit=5)]", None, [("search", {"_limit": 5})]),
    # Llama 3.1's built-in tools, as llama.cpp's tests write and read them.
    ("test-chat.cpp code_interpreter", "<|python_tag|>code_interpreter.call(code=\"print('hey')\")", None,
     [("code_interpreter", {"code": "print('hey')"})]),
    ("test-chat.cpp python", "<|python_tag|>python.call(code=\"print('hey')\")", None,
     [("python", {"code": "print('hey')"})]),
    ("built-in brave_search after text", 'Let me search. <|python_tag|>brave_search.call(query="weather in Paris")',
     "Let me search.", [("brave_search", {"query": "weather in Paris"})]),
    ("built-in wolfram_alpha, two arguments",
     '<|python_tag|>wolfram_alpha.call(query="integrate x^2", precision=3 )', None,
     [("wolfram_alpha", {"query": "integrate x^2", "precision": 3})]),
]


@pytest.mark.parametrize("source, text, content, calls", CASES, ids=[case[0] for case in CASES])
def test_expected_parses_whole_and_one_character_at_a_time(source, text, content, calls):
    whole = read(text)
    assert summary(whole) == (content, None, calls)  # (a JSON object that names no function has an error)
    assert summary(read(text, pieces=True)) == summary(whole)


@pytest.mark.parametrize("text", ["[Note] brackets begin this answer.", "[1, 2, 3] are numbers.", "[link](http://x)"])
def test_a_leading_bracket_that_begins_no_call_is_content(text):
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert summary(parsed) == (text, None, []) and parsed.error is None


@pytest.mark.parametrize("text", [
    '<|python_tag|>brave_search.call(query="weather in',
    '<|python_tag|>brave_search.ca',
    '{"name": "create_event", "parameters": {"title": "Standup", "duration_minutes": 15,',
    '[get_weather(city="San Francisco"), get_weather(city="Seattle',
    "<|python_start|>[get_weather(city='LA'",
])
def test_a_cut_off_call_is_dropped_with_an_error_never_a_call(text):
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None


def test_a_call_cut_off_after_whole_calls_is_dropped_and_the_whole_ones_kept():
    text = '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"a": '
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert summary(parsed) == (None, None, [("f", {})]) and parsed.error == CUT_OFF
