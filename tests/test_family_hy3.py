"""The hy3 family (Tencent Hunyuan 3): <tool_calls:opensource><tool_call:opensource>NAME<tool_sep:opensource>
<arg_key:opensource>KEY</arg_key:opensource><arg_value:opensource>VALUE</arg_value:opensource>...

llama.cpp reads this template with its automatic parser and has no expected parses for it in
tests/test-chat.cpp; the cases below are the template's own rendering of assistant turns
(tests/data/llama.cpp-templates/tencent-Hy3.jinja, lines cited)."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere

from multiseq.tools.families import family_named
from multiseq.tools.family import CUT_OFF

FAMILY = "hy3"
THINKING = "<｜hy_Assistant:opensource｜><think:opensource>"  # tencent-Hy3.jinja:215 (effort low/high)
NOT_THINKING = THINKING + "</think:opensource>"  # tencent-Hy3.jinja:217 (no_think, the default)
EOS = "<｜hy_eos:opensource｜>"
HELLO = "Hello, world!\nWhat's up?"


def call(function: str, **values: str) -> str:
    """A call as tencent-Hy3.jinja:174-182 writes it."""
    arguments = "".join(f"<arg_key:opensource>{key}</arg_key:opensource>\n"
                        f"<arg_value:opensource>{value}</arg_value:opensource>\n" for key, value in values.items())
    return f"<tool_call:opensource>{function}<tool_sep:opensource>\n{arguments}</tool_call:opensource>\n"


def block(*calls: str) -> str:
    return "<tool_calls:opensource>\n" + "".join(calls) + "</tool_calls:opensource>" + EOS


def test_the_hy3_template_is_detected():
    assert detected("tencent-Hy3.jinja") == FAMILY


def test_the_generation_prompt_opens_the_reasoning():
    assert family_named(FAMILY).opens_reasoning(THINKING)
    assert not family_named(FAMILY).opens_reasoning(NOT_THINKING)


@pytest.mark.parametrize("prompt, text, content, reasoning, calls", [
    (NOT_THINKING, HELLO + EOS, HELLO, None, []),
    (THINKING, "I'm\nthinking</think:opensource>" + HELLO + EOS, HELLO, "I'm\nthinking", []),
    (NOT_THINKING, block(call("special_function", arg1="1")), None, None, [("special_function", {"arg1": 1})]),
    (THINKING, "I'm\nthinking</think:opensource>Let me check." + block(
        call("special_function_with_opt", arg1="1", arg2="2"),
        call("python", code='print("hi")\nprint(2 < 3)')), "Let me check.", "I'm\nthinking",
     [("special_function_with_opt", {"arg1": 1, "arg2": 2}), ("python", {"code": 'print("hi")\nprint(2 < 3)'})]),
    # A string that looks like a number stays a string; JSON values of other types are read.
    (NOT_THINKING, block(call("magic", name="fooBar", ref="5123123"), call("todo_list", todos='["a", "b"]')),
     None, None, [("magic", {"name": "fooBar", "ref": "5123123"}), ("todo_list", {"todos": ["a", "b"]})]),
    (NOT_THINKING, block(call("empty_args")), None, None, [("empty_args", {})]),
    # A call block ends reasoning the model never closed.
    (THINKING, "I'll look.\n" + block(call("special_function", arg1="1")), None, "I'll look.",
     [("special_function", {"arg1": 1})]),
])
def test_template_renderings(prompt, text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    text = "Sure." + block(call("python", code="print(1)"))[:90]
    parsed = read_everywhere(text, FAMILY, NOT_THINKING)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == "Sure."


def test_a_block_that_cannot_be_read_is_content_with_an_error():
    text = "<tool_calls:opensource>\nget_weather(city='Paris')\n</tool_calls:opensource>"
    parsed = read_everywhere(text + EOS, FAMILY, NOT_THINKING, markers_are_text=True)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text
