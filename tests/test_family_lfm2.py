"""The lfm2 family (Liquid LFM2, LFM2.5): <|tool_call_start|>[name(key=value)]<|tool_call_end|>,
<think> reasoning. Expected parses copied from llama.cpp's tests/test-chat.cpp (test_lfm2_parser)."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed
from test_family_grammars_unit import family_accepts
from multiseq.tools.writing import written

from multiseq.tools import ChoiceMode, Tool, ToolChoice, read_output
from multiseq.tools.families import family_named
from multiseq.tools.family import CUT_OFF

FAMILY = "lfm2"
START, END = "<|tool_call_start|>", "<|tool_call_end|>"


@pytest.mark.parametrize("name", ["LFM2-8B-A1B.jinja", "LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja"])
def test_templates_are_detected(name):
    assert detected(name) == FAMILY


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:2019
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:2022
    (START + "[special_function(arg1=1)]" + END, None, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:2028
    (START + '[get_time(city="XYZCITY")]' + END, None, None, [("get_time", {"city": "XYZCITY"})]),
    # test-chat.cpp:2034, 2039
    (START + "[toggle(enabled=True)]" + END, None, None, [("toggle", {"enabled": True})]),
    (START + "[set_nullable(value=None)]" + END, None, None, [("set_nullable", {"value": None})]),
    # test-chat.cpp:2045, 2051
    (START + '[set_config(config={"enabled": True, "count": 3})]' + END, None, None,
     [("set_config", {"config": {"enabled": True, "count": 3}})]),
    (START + '[set_config(config={"enabled": true, "note": null})]' + END, None, None,
     [("set_config", {"config": {"enabled": True, "note": None}})]),
    # test-chat.cpp:2057
    (START + '[Calendar.create_event(title="demo", participants=["Alice", "Bob"], '
     'metadata={"priority": "high", "reminder": true})]' + END, None, None,
     [("Calendar.create_event", {"title": "demo", "participants": ["Alice", "Bob"],
                                 "metadata": {"priority": "high", "reminder": True}})]),
    # test-chat.cpp:2066
    ("Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).",
     "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).", None, []),
    # test-chat.cpp:2073, 2082, 2090
    (START + "[python(code=\"def hello():\\n    print('hey')\")]" + END, None, None,
     [("python", {"code": "def hello():\n    print('hey')"})]),
    (START + '[python(code="First line\\nSecond line\\tindented")]' + END, None, None,
     [("python", {"code": "First line\nSecond line\tindented"})]),
    (START + '[python(code="print(\\"hi\\")")]' + END, None, None, [("python", {"code": 'print("hi")'})]),
    # test-chat.cpp:2098
    ("Let me check the time." + START + '[get_time(city="Paris")]' + END, "Let me check the time.", None,
     [("get_time", {"city": "Paris"})]),
    # test-chat.cpp:2106
    (START + "[special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)]" + END, None, None,
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # test-chat.cpp:2123
    (START + "[empty_args()]" + END, None, None, [("empty_args", {})]),
    # test-chat.cpp:5242, 5249
    ("<think>I'm\nthinking</think>" + START + "[special_function(arg1=1)]" + END, None, "I'm\nthinking",
     [("special_function", {"arg1": 1})]),
    ("<think>I need to call a function</think>Let me check the time." + START + '[get_time(city="Paris")]' + END,
     "Let me check the time.", "I need to call a function", [("get_time", {"city": "Paris"})]),
    # test-chat.cpp:5259: a call's markers inside the reasoning are reasoning
    ("<think>Let me think about " + START + "[special_function(arg1=1)]" + END + " hmm</think>"
     + START + "[special_function(arg1=1)]" + END,
     None, "Let me think about " + START + "[special_function(arg1=1)]" + END + " hmm",
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5270
    ("<think>I'm\nthinking</think>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # llama.cpp's earlier LFM2 parser (JSON tools): [{"name": ..., "arguments": {...}}]
    (START + '[{"name": "get_time", "arguments": {"city": "Paris"}}]' + END, None, None,
     [("get_time", {"city": "Paris"})]),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, markers_expected=START in (reasoning or ""))
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    # test-chat.cpp:2116 (a partial call while streaming; at the end it is no call)
    text = START + "[special_function(arg1="
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None
    _, shown = streamed(text, FAMILY, list(text))
    assert shown == ""


@pytest.mark.parametrize("body", ["[special_function(1)]", "[__import__('os').system('x')]", "[f(x=open('y'))]",
                                  "[f(x=1e999)]"])
def test_what_is_not_a_call_of_literals_is_content(body):
    text = START + body + END
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text


# --- constrained calls (the family's CallSyntax) -------------------------------------------------

CONTROL = (START, END, "<think>", "</think>", "<|im_end|>")  # LFM2's control tokens
WEATHER = Tool("get_weather", None, {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "metric": {"type": "boolean"},
    "units": {"type": "object", "properties": {"temp": {"enum": ["c", "f"]}, "detail": {"type": "object"}},
              "required": ["temp"]},
    "note": {"type": ["string", "null"]}}, "required": ["city"]})
SEARCH = Tool("search", None, {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}})
CLOCK = Tool("now")
# Any text but a control token's (nor the section's closer as text: the reader ends the section at the first one).
TRICKY = 'Zürich "old town" <b>&amp;</b>\n\tline 2 — 東京 \\ {x} [y] \'z\' <|im_start|>)]'


REQUIRED = ToolChoice(ChoiceMode.REQUIRED)


def constrained(text: str, tools=(WEATHER, SEARCH, CLOCK), choice=REQUIRED, control=CONTROL):
    """Whether the family's grammar accepts `text`, and the text read back."""
    return family_accepts(text, family_named(FAMILY), tools, choice, control), read_output(text, FAMILY, tools=tools)


@pytest.mark.parametrize("control", [CONTROL, ()], ids=["control-tokens", "text"])
@pytest.mark.parametrize("calls", [
    [("get_weather", {"city": TRICKY, "days": 3, "metric": False, "units": {"temp": "c", "detail": {"wind": [1, 2.5]}},
                      "note": None})],
    [("get_weather", {"city": "Paris", "units": {"temp": "f"}}), ("search", {"limit": 2}), ("now", {})],
    [("search", {}), ("search", {"query": "a, b", "limit": 1}), ("get_weather", {"city": "", "note": "n"})],
])
def test_a_constrained_call_reads_back_as_itself(calls, control):
    text = written(family_named(FAMILY).call_syntax, calls)
    accepted, parsed = constrained(text, control=control)
    assert accepted, text
    assert calls_of(parsed) == calls and parsed.content is None and parsed.error is None


def test_the_syntax_is_keyword_arguments_with_json_values():
    assert written(family_named(FAMILY).call_syntax, [("get_weather", {"city": 'a "b"', "days": 2}), ("now", {})]) == (
        START + '[get_weather(city="a \\"b\\"", days=2), now()]' + END)


@pytest.mark.parametrize("body", [
    "get_weather(city='Paris')",  # a string not JSON
    'get_weather(, city="Paris")', 'get_weather(city="Paris",)', 'get_weather(city="Paris" days=3)',
    'get_weather(days=3, city="Paris")',  # not in the schema's order
    "get_weather(days=3)", 'get_weather(city="Paris", days=0)', 'get_weather(city="Paris", metric=True)',
    'get_weather(city="Paris", units={"temp": "k"})', 'get_weather(city="Paris", town="x")', "search(, limit=1)",
    'get_weather(city="Paris"),now()', "get_time()",
])
def test_the_grammar_refuses_what_does_not_follow_the_syntax_or_the_schema(body):
    assert not constrained(START + "[" + body + "]" + END)[0]


def test_auto_a_named_function_and_reasoning():
    call = START + '[search(query="x")]' + END
    auto = ToolChoice(ChoiceMode.AUTO)
    assert constrained("Let me look. " + call, choice=auto)[0] and constrained("No call needed.", choice=auto)[0]
    assert constrained("<think>The user wants x.</think>" + call)[0]
    assert constrained(call, choice=ToolChoice(ChoiceMode.FUNCTION, "search"))[0]
    assert not constrained(START + "[now()]" + END, choice=ToolChoice(ChoiceMode.FUNCTION, "search"))[0]


def test_names_and_keys_that_are_not_python_identifiers_are_written_in_the_json_form():
    tools = (Tool("get-weather", None, {"type": "object", "properties": {"city": {"type": "string"}}}),
             Tool("convert", None, {"type": "object", "properties": {"from": {"type": "string"}}}), CLOCK)
    calls = [("get-weather", {"city": "Paris"}), ("convert", {"from": "EUR"}), ("now", {})]
    text = written(family_named(FAMILY).call_syntax.fallback, calls)
    assert text == (START + '[{"name": "get-weather", "arguments": {"city": "Paris"}}, {"name": "convert", "arguments": '
                    '{"from": "EUR"}}, {"name": "now", "arguments": {}}]' + END)
    accepted, parsed = constrained(text, tools=tools)
    assert accepted and calls_of(parsed) == calls
    assert not constrained(START + '[convert(from="EUR")]' + END, tools=tools)[0]
