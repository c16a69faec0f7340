"""The solar-open family (Upstage Solar Open): <|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME
<|tool_call:args|>{json}<|tool_call:end|><|calls|>, reasoning in <|think|>...<|end|>.

llama.cpp reads this template with its automatic parser and has no expected parses for it in
tests/test-chat.cpp; the cases below are the template's own rendering of assistant turns
(tests/data/llama.cpp-templates/upstage-Solar-Open-100B.jinja, lines cited), after its
generation prompt `<|begin|>assistant`."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere

from multiseq.tools.families import family_named
from multiseq.tools.family import CUT_OFF

FAMILY = "solar-open"
PROMPT = "<|begin|>assistant"
LOW_EFFORT = "<|begin|>assistant<|think|><|end|><|begin|>assistant"  # the template's last lines
HELLO = "Hello, world!\nWhat's up?"


def call(identifier: str, function: str, arguments: str) -> str:
    # upstage-Solar-Open-100B.jinja:140-142
    return f"<|tool_call:begin|>{identifier}<|tool_call:name|>{function}<|tool_call:args|>{arguments}<|tool_call:end|>"


def calls(*written: str) -> str:
    return "<|tool_calls|>" + "".join(written) + "<|calls|>"  # upstage-Solar-Open-100B.jinja:138-144


def thought(text: str) -> str:
    return f"<|think|>{text}<|end|><|begin|>assistant"  # upstage-Solar-Open-100B.jinja:132


def test_the_solar_open_template_is_detected():
    assert detected("upstage-Solar-Open-100B.jinja") == FAMILY
    assert not family_named(FAMILY).opens_reasoning(LOW_EFFORT)


@pytest.mark.parametrize("prompt, text, content, reasoning, calls_read", [
    # upstage-Solar-Open-100B.jinja:146
    (PROMPT, "<|content|>" + HELLO + "<|end|>", HELLO, None, []),
    (LOW_EFFORT, "<|content|>" + HELLO + "<|end|>", HELLO, None, []),
    (PROMPT, thought("I'm\nthinking") + "<|content|>" + HELLO + "<|end|>", HELLO, "I'm\nthinking", []),
    (PROMPT, calls(call("a1b2c3d4e5", "special_function", '{"arg1": 1}')), None, None,
     [("special_function", {"arg1": 1})]),
    (PROMPT, thought("I'm\nthinking") + calls(call("a1b2c3d4e5", "special_function", '{"arg1": 1}'),
                                              call("f6g7h8i9j0", "python", '{"code": "print(\\"<|end|>\\")"}')),
     None, "I'm\nthinking", [("special_function", {"arg1": 1}), ("python", {"code": 'print("<|end|>")'})]),
    (PROMPT, calls(call("k1", "empty_args", "{}")), None, None, [("empty_args", {})]),
])
def test_template_renderings(prompt, text, content, reasoning, calls_read):
    parsed = read_everywhere(text, FAMILY, prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls_read)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    text = calls(call("a1b2c3d4e5", "special_function", '{"arg1": 1}'))[:80]
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF
    assert parsed.content is None  # neither the call's markers nor its raw text


def test_arguments_that_are_not_json_are_content_with_an_error():
    text = calls(call("a1b2c3d4e5", "special_function", "arg1=1"))
    parsed = read_everywhere(text, FAMILY, PROMPT, markers_are_text=True)
    assert parsed.tool_calls == () and parsed.error and "arg1=1" in parsed.content
