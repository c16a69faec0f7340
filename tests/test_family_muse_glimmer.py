"""The muse-glimmer family: messages addressed ` to=RECIPIENT<|message|>...<|eom|>`, calls as ATEM
markup in a message to the tool. Expected parses copied from llama.cpp's tests/test-chat.cpp
(vendored llama.cpp); outputs begin after the generation prompt `<|start|>assistant`."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere

from multiseq.tools.families import family_named
from multiseq.tools.family import CUT_OFF

FAMILY = "muse-glimmer"
PROMPT = "<|start|>assistant"
HELLO = "Hello, world!\nWhat's up?"
# test-chat.cpp:6357
CALL_MARKUP = ('<atem:function_calls>\n<atem:invoke name="special_function">\n'
               '<atem:parameter name="arg1">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')
ARG1 = [("special_function", {"arg1": 1})]
INVOICE = '{"amount": 123.45, "date": "2025-12-03"}'


def test_the_muse_glimmer_template_is_detected():
    assert detected("muse-glimmer.jinja") == FAMILY
    assert detected("openai-gpt-oss-120b.jinja") != FAMILY


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:6365
    (" to=user<|message|>" + HELLO + "<|eot|>", HELLO, None, []),
    # test-chat.cpp:6372
    (" to=special_function<|message|>" + CALL_MARKUP, None, None, ARG1),
    # test-chat.cpp:6380 (an answer, then a call in the same generation)
    (" to=user<|message|>" + HELLO + "<|eom|><|start|>assistant to=special_function<|message|>" + CALL_MARKUP,
     HELLO, None, ARG1),
    # test-chat.cpp:6398
    (" to=user<|message|>" + INVOICE, INVOICE, None, []),
    # test-chat.cpp:6405
    (" to=self<|message|>I need to output the invoice details in JSON<|eom|><|start|>assistant to=user<|message|>"
     + INVOICE, INVOICE, "I need to output the invoice details in JSON", []),
    # reasoning, then two calls (the template's rendering of a turn with calls)
    (" to=self<|message|>Two calls.<|eom|><|start|>assistant to=special_function<|message|>" + CALL_MARKUP
     + "<|eom|><|start|>assistant to=special_function<|message|>" + CALL_MARKUP.replace(">1<", ">2<") + "<|eom|>",
     None, "Two calls.", ARG1 + [("special_function", {"arg1": 2})]),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


@pytest.mark.parametrize("text, content, reasoning", [
    # test-chat.cpp:6391 (markup quoted in an answer is text)
    (" to=user<|message|>You invoke it like this:\n" + CALL_MARKUP + "<|eot|>",
     "You invoke it like this:\n" + CALL_MARKUP, None),
    # test-chat.cpp:6414 (markup in the reasoning is reasoning)
    (" to=self<|message|>I could use " + CALL_MARKUP + " here<|eom|><|start|>assistant to=user<|message|>Hello!<|eot|>",
     "Hello!", "I could use " + CALL_MARKUP + " here"),
])
def test_markup_outside_a_call_message_is_text(text, content, reasoning):
    parsed = read_everywhere(text, FAMILY, PROMPT, markers_are_text=True)
    assert (parsed.content, parsed.reasoning, parsed.tool_calls, parsed.error) == (content, reasoning, (), None)


def test_a_prompt_inside_the_reasoning_message():
    prompt = PROMPT + " to=self<|message|>"
    assert family_named(FAMILY).opens_reasoning(prompt) and not family_named(FAMILY).opens_reasoning(PROMPT)
    parsed = read_everywhere("I'm\nthinking<|eom|><|start|>assistant to=user<|message|>" + HELLO, FAMILY, prompt)
    assert (parsed.content, parsed.reasoning) == (HELLO, "I'm\nthinking")


def test_string_parameters_keep_their_text():
    text = (' to=python<|message|><atem:function_calls>\n<atem:invoke name="python">\n<atem:parameter name="code">'
            'print("a")\n  x = 1\n</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eom|>')
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert calls_of(parsed) == [("python", {"code": 'print("a")\n  x = 1\n'})]


def test_a_cut_off_call_is_dropped_with_an_error():
    text = " to=special_function<|message|>" + CALL_MARKUP[:60]
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None


def test_a_call_message_that_is_no_markup_is_content_with_an_error():
    parsed = read_everywhere(" to=special_function<|message|>arg1 is one<|eom|>", FAMILY, PROMPT, markers_are_text=True)
    assert parsed.tool_calls == () and parsed.error and "arg1 is one" in parsed.content
