"""The kimi family: Kimi K2's section tokens (functions.NAME:INDEX ids, JSON arguments) and
Kimi K3's XTML (<|open|>/<|close|>/<|sep|> elements). Expected parses copied from llama.cpp's
tests/test-chat.cpp (the Kimi-K2-Thinking, Kimi-K2 and Kimi-K3 blocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import TextDelta, Tool, output_parser, read_output
from multiseq.tools.families import detect
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
K2_PROMPT = "<|im_assistant|>assistant<|im_middle|>"  # Kimi-K2-Thinking's: the model opens <think> itself
K3_PROMPT = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'  # Kimi-K3's, thinking on
MARKERS = ("<|tool_call", "<think>", "</think>", "<|open|>", "<|close|>", "<|sep|>")

INTEGER = {"type": "integer"}
TOOLS = (
    Tool("special_function", parameters={"type": "object", "properties": {"arg1": INTEGER}, "required": ["arg1"]}),
    Tool("special_function_with_opt", parameters={"type": "object", "properties": {"arg1": INTEGER, "arg2": INTEGER}}),
    Tool("python", parameters={"type": "object", "properties": {"code": {"type": "string"}}}),
    Tool("html", parameters={"type": "object", "properties": {"markup": {"type": "string"}}}),
    Tool("empty_args", parameters={"type": "object", "properties": {}}),
)


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def summary(parsed):
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls], parsed.error)


def read_everywhere(text: str, template_name: str, prompt: str):
    """The text read whole and one character at a time: the same result."""
    whole = read_output(text, template=template(template_name), tools=TOOLS, prompt=prompt)
    pieces = read_output(list(text), template=template(template_name), tools=TOOLS, prompt=prompt)
    assert summary(pieces) == summary(whole)
    return whole


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja",
                                  "Kimi-K3.jinja"])
def test_templates_are_detected(name):
    assert detect(template(name)).name == "kimi"


def test_variants():
    family = detect(template("Kimi-K3.jinja"))
    assert family.variant_of(template("Kimi-K3.jinja")) == "kimi-k3"
    assert family.variant_of(template("Kimi-K2-Thinking.jinja")) == "kimi-k2"
    assert family.opens_reasoning(K3_PROMPT) and family.opens_reasoning(K2_PROMPT + "<think>")
    assert not family.opens_reasoning('<|open|>message role="assistant"<|sep|><|open|>response<|sep|>')


K2_CALL = '<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|>'


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:4971
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:4974
    (f"<|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>", None, None,
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4982
    (f"<think>I'm thinking about this</think><|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>",
     None, "I'm thinking about this", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4992
    (f"Hello, world!\nWhat's up?<|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>",
     "Hello, world!\nWhat's up?", None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5065 (three calls, markup in a string)
    ("<|tool_calls_section_begin|>" + K2_CALL
     + '<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{"code": "print(1)"}<|tool_call_end|>'
     '<|tool_call_begin|>functions.html:2<|tool_call_argument_begin|>{"markup": "<p>test</p>"}<|tool_call_end|>'
     "<|tool_calls_section_end|>", None, None,
     [("special_function", {"arg1": 1}), ("python", {"code": "print(1)"}), ("html", {"markup": "<p>test</p>"})]),
    # test-chat.cpp:5084: calls inside the unclosed reasoning
    ("<think>I need to call two functions<|tool_calls_section_begin|>" + K2_CALL
     + "<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{\"code\": \"print('hey')\"}<|tool_call_end|>"
     "<|tool_calls_section_end|>", None, "I need to call two functions",
     [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
    # test-chat.cpp:5103: ... and without the section's markers or the calls' end markers
    ("<think>I need to call two functions"
     '<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{"arg1": 1}'
     "<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{\"code\": \"print('hey')\"}",
     None, "I need to call two functions", [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
])
def test_llama_cpp_k2_thinking_parses(text, content, reasoning, calls):
    assert summary(read_everywhere(text, "Kimi-K2-Thinking.jinja", K2_PROMPT)) == (content, reasoning, calls, None)


@pytest.mark.parametrize("name", ["moonshotai-Kimi-K2.jinja", "Kimi-K2-Instruct.jinja"])
def test_llama_cpp_k2_instruct_parses(name):
    # test-chat.cpp:5186 and 5197
    text = f"<|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>"
    assert summary(read_everywhere(text, name, K2_PROMPT)) == (None, None, [("special_function", {"arg1": 1})], None)


K3_CALL = ('<|open|>call tool="special_function" index="1"<|sep|>'
           '<|open|>argument key="arg1" type="number"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>')


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:4869
    ("<|open|>response<|sep|>Hello, world!\nWhat's up?<|close|>response<|sep|><|close|>message<|sep|>",
     "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:4875
    ("I'm thinking about this<|close|>think<|sep|><|open|>response<|sep|>Hello, world!\nWhat's up?"
     "<|close|>response<|sep|><|close|>message<|sep|>", "Hello, world!\nWhat's up?", "I'm thinking about this", []),
    # test-chat.cpp:4883
    ("<|open|>response<|sep|>Use the response tag, then message the handler.<|close|>response<|sep|>"
     "<|close|>message<|sep|>", "Use the response tag, then message the handler.", None, []),
    # test-chat.cpp:4889
    ("I was still thinking when the budget ran out", None, "I was still thinking when the budget ran out", []),
    # test-chat.cpp:4907
    ("I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
     f"<|open|>tools<|sep|>{K3_CALL}<|close|>tools<|sep|><|close|>message<|sep|>",
     "On it.", "I should call it", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4933
    ("<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>" + K3_CALL
     + '<|open|>call tool="special_function_with_opt" index="2"<|sep|>'
     '<|open|>argument key="arg1" type="number"<|sep|>1<|close|>argument<|sep|>'
     '<|open|>argument key="arg2" type="number"<|sep|>2<|close|>argument<|sep|>'
     "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", None, None,
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # test-chat.cpp:4951
    ("<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
     '<|open|>call tool="python" index="1"<|sep|>'
     "<|open|>argument key=\"code\" type=\"string\"<|sep|>print('hey')<|close|>argument<|sep|>"
     "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", None, None,
     [("python", {"code": "print('hey')"})]),
])
def test_llama_cpp_k3_parses(text, content, reasoning, calls):
    assert summary(read_everywhere(text, "Kimi-K3.jinja", K3_PROMPT)) == (content, reasoning, calls, None)


def test_k3_value_holding_its_closer_text():
    text = ("Write it.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
            '<|open|>call tool="python" index="1"<|sep|><|open|>argument key="code" type="string"<|sep|>'
            "<|close|>argument<|sep|> ends args<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>")
    parsed = read_everywhere(text, "Kimi-K3.jinja", K3_PROMPT)
    assert summary(parsed) == (None, "Write it.", [("python", {"code": "<|close|>argument<|sep|> ends args"})], None)


K2_CUT = ('Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0'
          '<|tool_call_argument_begin|>{"arg')
K3_CUT = ('<|open|>tools<|sep|><|open|>call tool="python" index="1"<|sep|>'
          '<|open|>argument key="code" type="string"<|sep|>print(')


@pytest.mark.parametrize("template_name, prompt, text, content", [
    ("Kimi-K2-Thinking.jinja", K2_PROMPT, K2_CUT, "Sure."),
    ("Kimi-K3.jinja", K3_PROMPT, "Go.<|close|>think<|sep|>" + K3_CUT, None),
])
def test_a_cut_off_call_is_dropped_with_an_error(template_name, prompt, text, content):
    parsed = read_everywhere(text, template_name, prompt)
    assert (parsed.tool_calls, parsed.content, parsed.error) == ((), content, CUT_OFF)
    # While it streamed (before the end settled it), no marker was shown as content.
    assert not any(marker in _streamed_content(text, template_name, prompt) for marker in MARKERS)


def _streamed_content(text: str, template_name: str, prompt: str) -> str:
    """The content deltas of the text fed one character at a time, without closing the stream."""
    parser = output_parser(template=template(template_name), tools=TOOLS, prompt=prompt)
    return "".join(delta.text for piece in text for delta in parser.feed(piece) if isinstance(delta, TextDelta))
