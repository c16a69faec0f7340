"""The apertus family: <|tools_prefix|>[{"name": {...}}]<|tools_suffix|>, <|inner_prefix|> reasoning.
Expected parses copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "apertus"


def test_template_is_detected():
    assert detected("Apertus-8B-Instruct.jinja") == FAMILY


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:5424
    ('<|tools_prefix|>[{"special_function": {"arg1": 1}}]<|tools_suffix|>', None, None,
     [("special_function", {"arg1": 1})]),
    # llama.cpp's earlier Apertus parser (common_chat_parse_apertus): reasoning, then calls
    ("<|inner_prefix|>I'm\nthinking<|inner_suffix|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?",
     "I'm\nthinking", []),
    ('<|inner_prefix|>I\'m\nthinking<|inner_suffix|><|tools_prefix|>[{"special_function": {"arg1": 1}}, '
     '{"special_function_with_opt": {"arg1": 1, "arg2": 2}}]<|tools_suffix|>', None, "I'm\nthinking",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ('Let me check.<|tools_prefix|>[{"get_time": {"city": "Paris"}}]<|tools_suffix|><|assistant_end|>',
     "Let me check.", None, [("get_time", {"city": "Paris"})]),
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, []),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    text = 'Sure.<|tools_prefix|>[{"special_function": {"arg1'
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == "Sure."
    _, shown = streamed(text, FAMILY, list(text))
    assert "<|tools_prefix|>" not in shown


def test_calls_that_are_not_json_are_content():
    text = "<|tools_prefix|>[special_function(arg1=1)]<|tools_suffix|>"
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text
