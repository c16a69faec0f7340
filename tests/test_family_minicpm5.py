"""The minicpm5 family (OpenBMB MiniCPM5): <function name="NAME"><param name="KEY">VALUE</param></function>,
reasoning in <think>. Expected parses copied from llama.cpp's tests/test-chat.cpp (vendored llama.cpp)."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere

from multiseq.tools.family import CUT_OFF

FAMILY = "minicpm5"
THINKING = "<|im_start|>assistant\n<think>\n"  # the generation prompt, enable_thinking true
NOT_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking false
HELLO = "Hello, world!\nWhat's up?"


def test_the_minicpm5_template_is_detected():
    assert detected("openbmb-MiniCPM5-1B.jinja") == FAMILY


@pytest.mark.parametrize("prompt, text, content, reasoning, calls", [
    # test-chat.cpp:6874
    (NOT_THINKING, HELLO, HELLO, None, []),
    # test-chat.cpp:6880
    (NOT_THINKING, """<function name="python"><param name="code">print('Hello, World!')</param></function>""",
     None, None, [("python", {"code": "print('Hello, World!')"})]),
    # test-chat.cpp:6887 (no arguments)
    (NOT_THINKING, '<function name="empty_args"></function>', None, None, [("empty_args", {})]),
    # test-chat.cpp:6894
    (NOT_THINKING, """<function name="python"><param name="code">print('x')</param></function>""",
     None, None, [("python", {"code": "print('x')"})]),
    # test-chat.cpp:6903 (CDATA: the value may hold </param>)
    (NOT_THINKING, '<function name="html"><param name="markup"><![CDATA[<a href="/x">hi</a> </param>]]></param>'
                   "</function>", None, None, [("html", {"markup": '<a href="/x">hi</a> </param>'})]),
    # test-chat.cpp:6910
    (THINKING, """I'm thinking</think><function name="python"><param name="code">print('hey')</param></function>""",
     None, "I'm thinking", [("python", {"code": "print('hey')"})]),
    # test-chat.cpp:6918 (parallel calls)
    (NOT_THINKING, """<function name="python"><param name="code">print('x')</param></function>\n"""
                   """<function name="python"><param name="code">print('y')</param></function>""",
     None, None, [("python", {"code": "print('x')"}), ("python", {"code": "print('y')"})]),
    # test-chat.cpp:6930 (there the prompt holds the reasoning's start, "I'm": here it is left out)
    (THINKING, " thinking</think>" + HELLO, HELLO, "thinking", []),
])
def test_llama_cpp_parses(prompt, text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_content_before_a_call_and_the_end_of_the_turn():
    text = 'Let me run it.\n<function name="special_function"><param name="arg1">1</param></function><|im_end|>'
    parsed = read_everywhere(text, FAMILY, NOT_THINKING)
    assert (parsed.content, calls_of(parsed)) == ("Let me run it.", [("special_function", {"arg1": 1})])


def test_a_cut_off_call_is_dropped_with_an_error():
    text = """Sure.\n<function name="python"><param name="code">print('x"""
    parsed = read_everywhere(text, FAMILY, NOT_THINKING)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == "Sure."


def test_a_call_that_cannot_be_read_is_content_with_an_error():
    text = '<function name="python"><code>x</code></function>'
    # Shown as soon as it is known to be no call: its markers are its raw text.
    parsed = read_everywhere(text, FAMILY, NOT_THINKING, markers_are_text=True)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text
