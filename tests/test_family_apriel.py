"""The apriel family (ServiceNow Apriel 1.5, 1.6): <tool_calls>[...]</tool_calls>, reasoning before
[BEGIN FINAL RESPONSE]. Expected parses copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "apriel"
# The end of Apriel 1.6's generation prompt (Apriel-1.6-15b-Thinker-fixed.jinja).
THINKER_PROMPT = "\n<|begin_assistant|>\nHere are my reasoning steps:\n"


@pytest.mark.parametrize("name", ["unsloth-Apriel-1.5.jinja", "Apriel-1.6-15b-Thinker-fixed.jinja"])
def test_templates_are_detected_before_hermes(name):
    assert detected(name) == FAMILY


@pytest.mark.parametrize("text, prompt, content, reasoning, calls", [
    # test-chat.cpp:6191, 6192
    ("Hello, world!\nWhat's up?", "", "Hello, world!\nWhat's up?", None, []),
    ('<tool_calls>[{"name": "special_function", "arguments": {"arg1": 1}}]</tool_calls>', "", None, None,
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:6211 (llama.cpp's reasoning also holds the prompt's "Here are my reasoning steps:")
    ("I'm\nthinking\n[BEGIN FINAL RESPONSE]\nHello, world!\nWhat's up?", THINKER_PROMPT,
     "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # test-chat.cpp:6219
    ('I\'m\nthinking\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{"name": "special_function", "arguments": '
     '{"arg1": 1}}]</tool_calls>', THINKER_PROMPT, None, "I'm\nthinking", [("special_function", {"arg1": 1})]),
    # llama.cpp's earlier Apriel 1.5 parser: <thinking> reasoning, several calls
    ('<thinking>I\'m\nthinking</thinking><tool_calls>[{"name": "special_function", "arguments": {"arg1": 1}}, '
     '{"name": "get_time", "arguments": {"city": "Paris"}}]</tool_calls>', "", None, "I'm\nthinking",
     [("special_function", {"arg1": 1}), ("get_time", {"city": "Paris"})]),
])
def test_llama_cpp_parses(text, prompt, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, prompt=prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    text = 'Sure.\n<tool_calls>[{"name": "special_function", "arguments": {"arg1'
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == "Sure."
    _, shown = streamed(text, FAMILY, list(text))
    assert "<tool_calls>" not in shown
