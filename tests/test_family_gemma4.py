"""The Gemma 4 family: its templates are detected, llama.cpp's own expected parses of its
output (tests/test-chat.cpp) come out the same whole and one character at a time, a call not
in the notation is content with an error, and a call cut off is dropped with an error; neither
is ever a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.llama.chat_template import JinjaRenderer
from multiseq.tools import ChoiceMode, TextDelta, Tool, ToolChoice, output_parser, read_output
from multiseq.tools.families import detect, family_named
from multiseq.tools.families.gemma4 import CALL_CLOSE, CALL_OPEN, QUOTE
from multiseq.tools.family import CUT_OFF
from test_family_grammars_unit import family_accepts
from multiseq.tools.writing import written

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
FAMILY = family_named("gemma4")
THINKING_OFF = "<|turn>model\n<|channel>thought\n<channel|>"  # the template's generation prompt


def read(text: str, prompt: str = THINKING_OFF, pieces: bool = False, tools=()):
    return read_output(list(text) if pieces else text, "gemma4", prompt=prompt, tools=tools)


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


# --- constrained calls (the family's CallSyntax) -------------------------------------------------

CONTROL = (CALL_OPEN, CALL_CLOSE, QUOTE, "<|channel>", "<channel|>")  # Gemma 4's control tokens
DAY = {"type": "object", "properties": {"day": {"type": "integer"}, "month": {"type": "string"}}, "required": ["day"]}
WEATHER = Tool("get_weather", None, {"type": "object", "$defs": {"Day": DAY}, "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "metric": {"type": "boolean"},
    "note": {"type": ["string", "null"]}, "tags": {"type": "array", "items": {"type": "string"}},
    "Units": {"type": "object", "properties": {"temp": {"enum": ["c", "f"]}, "wind speed": {"type": "number"},
                                               "a:b": {"type": "string"}}, "required": ["temp"]},
    "when": {"anyOf": [{"$ref": "#/$defs/Day"}, {"type": "null"}]}, "extra": {"type": "object"}},
    "required": ["city"]})
CLOCK = Tool("now")
TRICKY = 'Zürich "old town" <b>&amp;</b>\n\tline 2 — 東京 \\ {x:1} [y], z:'
MARKED = TRICKY + " <tool_call|> <|tool_call>"  # the markers as text (as control tokens, no text holds them)


REQUIRED = ToolChoice(ChoiceMode.REQUIRED)


def constrained(text: str, tools=(WEATHER, CLOCK), choice=REQUIRED, control=CONTROL,
                prompt: str = THINKING_OFF):
    """Whether the family's grammar accepts `text`, and the text read back."""
    return family_accepts(text, FAMILY, tools, choice, control, prompt=prompt), read(text, prompt=prompt)


@pytest.mark.parametrize("control, text", [(CONTROL, TRICKY), ((), MARKED)], ids=["control-tokens", "text"])
@pytest.mark.parametrize("calls", [
    lambda text: [("get_weather", {
        "city": text, "days": 3, "metric": False, "note": None, "tags": [text, ""],
        "Units": {"temp": "c", "wind speed": 2.5, "a:b": "x"}, "when": {"day": 1, "month": "May"},
        "extra": {"deep": {"list": [1, True, None, text, {}], "key with space": []}}})],
    lambda text: [("get_weather", {"city": "Paris", "when": None}), ("now", {}),
                  ("get_weather", {"city": "", "Units": {"temp": "f"}})],
], ids=["every-kind", "several"])
def test_a_constrained_call_reads_back_as_itself(calls, control, text):
    calls = calls(text)
    output = written(FAMILY.call_syntax, calls)
    accepted, parsed = constrained(output, control=control)
    assert accepted, output
    assert summary(parsed) == (None, None, calls) and parsed.error is None


def test_the_grammar_writes_a_call_as_the_template_writes_it_back():
    arguments = {"city": 'Paris "Nice" <b>', "days": 3, "metric": True, "tags": ["a", "b c"],
                 "Units": {"wind speed": 2.5, "temp": "c"}, "when": {"month": "May", "day": 1}}
    messages = ({"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                                        "arguments": arguments}}]})
    rendered = JinjaRenderer((TEMPLATES / "google-gemma-4-31B-it.jinja").read_text(), "gemma", "<bos>", "<eos>",
                             add_bos=True).render(messages)
    text = written(FAMILY.call_syntax, [("get_weather", arguments)])
    assert "<|turn>model\n" + text + "<|tool_response>" in rendered
    assert text == ('<|tool_call>call:get_weather{city:<|"|>Paris "Nice" <b><|"|>,days:3,metric:true,'
                    'tags:[<|"|>a<|"|>,<|"|>b c<|"|>],Units:{temp:<|"|>c<|"|>,wind speed:2.5},'
                    'when:{day:1,month:<|"|>May<|"|>}}<tool_call|>')
    assert constrained(text)[0]


@pytest.mark.parametrize("arguments", [
    'days:3,city:<|"|>Paris<|"|>',  # keys not in the order of their names
    'city:"Paris"', 'city:<|"|>Paris<|"|>,days:"3"', 'city:<|"|>Paris<|"|>, days:3', 'city:<|"|>Paris<|"|>,days:0',
    'days:3', 'city:<|"|>Paris<|"|>,town:1', ',city:<|"|>Paris<|"|>', 'city:<|"|>Paris<|"|>,',
    'city:<|"|>Paris<|"|>,Units:{wind speed:1}', 'city:<|"|>Paris<|"|>,Units:{temp:<|"|>k<|"|>}',
    'city:<|"|>Paris<|"|>,Units:{"temp":<|"|>c<|"|>}', 'city:<|"|>Paris<|"|>,metric:True',
    'city:<|"|>Paris<|"|>,when:{month:<|"|>May<|"|>}', 'city:<|"|>Paris<|"|>,tags:[1]',
])
def test_the_grammar_refuses_what_does_not_follow_the_notation_or_the_schema(arguments):
    assert not constrained(CALL_OPEN + "call:get_weather{" + arguments + "}" + CALL_CLOSE)[0]


def test_auto_a_named_function_and_reasoning():
    call = CALL_OPEN + 'call:get_weather{city:<|"|>Paris<|"|>}' + CALL_CLOSE
    auto = ToolChoice(ChoiceMode.AUTO)
    # `auto`: free text until <|tool_call>, a control token free text never holds.
    assert constrained("Let me check. " + call, choice=auto)[0] and constrained(HELLO, choice=auto)[0]
    assert not constrained("Let me check. " + call.replace("city", "town"), choice=auto)[0]
    assert constrained("<|channel>thought\nThe user wants it.<channel|>" + call, prompt="<|turn>model\n")[0]
    assert constrained(call, choice=ToolChoice(ChoiceMode.FUNCTION, "get_weather"))[0]
    assert not constrained(CALL_OPEN + "call:now{}" + CALL_CLOSE, choice=ToolChoice(ChoiceMode.FUNCTION, "get_weather"))[0]


def test_a_key_the_notation_cannot_write_leaves_the_calls_unconstrained():
    quoted = Tool("say", None, {"type": "object", "properties": {'a <|"|> key': {"type": "string"}}})
    assert family_accepts("anything", FAMILY, (quoted,), ToolChoice(ChoiceMode.REQUIRED), CONTROL) is None
