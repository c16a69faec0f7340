"""The granite family (IBM Granite 3.x): <|tool_call|>[{"name": ..., "arguments": {...}}],
<think>/<response>. Expected parses copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "granite"


def test_granite_3_templates_are_detected_and_granite_4_stays_hermes():
    assert detected("ibm-granite-granite-3.3-2B-Instruct.jinja") == FAMILY
    # Granite 4.0 and 4.1 write <tool_call>{"name": ..., "arguments": ...}</tool_call>.
    assert detected("ibm-granite-granite-4.0.jinja") == "hermes"
    assert detected("ibm-granite-granite-4.1.jinja") == "hermes"


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:3369
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:3371
    ("<think>I'm\nthinking</think>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # test-chat.cpp:3377 (pending in llama.cpp's PEG parser; the parse its earlier Granite
    # parser gave)
    ("<think>I'm\nthinking</think><response>Hello, world!\nWhat's up?</response>",
     "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # llama.cpp's earlier Granite parser's cases (test-chat.cpp before the PEG parsers)
    ('<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]',
     None, None, [("special_function", {"arg1": 1})]),
    ('<think>I\'m\nthinking</think><|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}, '
     '{"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}}]',
     None, "I'm\nthinking", [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ('Let me check.\n<|tool_call|>[{"name": "get_time", "arguments": {"city": "Paris"}}]',
     "Let me check.", None, [("get_time", {"city": "Paris"})]),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


@pytest.mark.parametrize("text", [
    '<|tool_call|>[{"name": "special_function", "arguments": {"arg',
    '<|tool_call|>[{"name": "special_function"',
    '<think>I\'m\nthinking</think><|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}, {',
])
def test_a_cut_off_call_is_dropped_with_an_error(text):
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF
    assert parsed.content is None  # neither <|tool_call|> nor the calls as written
    _, shown = streamed(text, FAMILY, list(text))
    assert "<|tool_call|>" not in shown  # held back until the output ended


def test_a_call_that_is_not_json_is_content():
    text = 'Sure <|tool_call|>[{"name": special_function}] done'
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text
