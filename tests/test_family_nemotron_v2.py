"""The nemotron-v2 family (NVIDIA Nemotron Nano v2): <TOOLCALL>[...]</TOOLCALL>, <think> reasoning
opened by the prompt. Expected parses copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "nemotron-v2"
THINKING_PROMPT = "<SPECIAL_11>Assistant\n<think>\n"  # NVIDIA-Nemotron-Nano-v2.jinja's generation prompt


def test_template_is_detected():
    assert detected("NVIDIA-Nemotron-Nano-v2.jinja") == FAMILY


@pytest.mark.parametrize("text, prompt, content, reasoning, calls", [
    # test-chat.cpp:5852
    ('I\'m\nthinking\n</think>\n<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}]</TOOLCALL>',
     THINKING_PROMPT, None, "I'm\nthinking", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5858
    ('I\'m\nthinking\n</think>\n\n<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}]</TOOLCALL>\n',
     THINKING_PROMPT, None, "I'm\nthinking", [("special_function", {"arg1": 1})]),
    # Thinking off: the prompt wrote <think></think>
    ("Hello, world!\nWhat's up?", "<SPECIAL_11>Assistant\n<think></think>", "Hello, world!\nWhat's up?", None, []),
    ('<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}, '
     '{"name": "get_time", "arguments": {"city": "Paris"}}]</TOOLCALL>', "", None, None,
     [("special_function", {"arg1": 1}), ("get_time", {"city": "Paris"})]),
])
def test_llama_cpp_parses(text, prompt, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, prompt=prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    text = '<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}'
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None
    _, shown = streamed(text, FAMILY, list(text))
    assert shown == ""
