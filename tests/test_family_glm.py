"""The glm family: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call> (GLM 4.5/4.6
with newlines between the parts, 4.7 and 5.x compact), values typed by the tool's schema, reasoning in
<think>...</think>. Expected parses copied from llama.cpp's tests/test-chat.cpp (GLM-4.6, GLM-4.7-Flash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import TextDelta, Tool, output_parser, read_output
from multiseq.tools.families import detect
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
THINKING = "<|assistant|><think>"  # GLM-4.7-Flash's prompt, thinking on: the output starts inside <think>
NOT_THINKING = "<|assistant|></think>"  # ... thinking off
MARKERS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>",
           "</think>")

INTEGER = {"type": "integer"}
TOOLS = (
    Tool("special_function", parameters={"type": "object", "properties": {"arg1": INTEGER}, "required": ["arg1"]}),
    Tool("special_function_with_opt", parameters={"type": "object", "properties": {"arg1": INTEGER, "arg2": INTEGER}}),
    Tool("read_file_diff_md", parameters={"type": "object", "properties": {"review_id": {"type": "string"},
                                                                          "file_id": {"type": "string"}}}),
    Tool("write_file", parameters={"type": "object", "properties": {"path": {"type": "string"},
                                                                   "content": {"type": "string"}}}),
)


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def summary(parsed):
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls], parsed.error)


def read_everywhere(text: str, prompt: str, template_name: str = "GLM-4.7-Flash.jinja"):
    """The text read whole and one character at a time: the same result."""
    whole = read_output(text, template=template(template_name), tools=TOOLS, prompt=prompt)
    pieces = read_output(list(text), template=template(template_name), tools=TOOLS, prompt=prompt)
    assert summary(pieces) == summary(whole)
    return whole


@pytest.mark.parametrize("name", ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "Spark2.5.jinja",
                                  "inclusionai-ling-3.0-flash.jinja", "poolside-Laguna-S-2.1.jinja",
                                  "poolside-Laguna-XS-2.1.jinja", "poolside-Laguna-XS.2.jinja"])
def test_templates_are_detected(name):
    assert detect(template(name)).name == "glm"


def test_glm_4_6_newline_call():
    # test-chat.cpp:4389
    text = "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"
    parsed = read_everywhere(text, "<|assistant|>", "GLM-4.6.jinja")
    assert summary(parsed) == (None, None, [("special_function", {"arg1": 1})], None)


@pytest.mark.parametrize("text, prompt, content, reasoning, calls", [
    # test-chat.cpp:4404
    ("Hello, world!\nWhat's up?", NOT_THINKING, "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:4411
    ("I'm\nthinking</think>Hello, world!\nWhat's up?", THINKING, "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # test-chat.cpp:4419
    ("<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>", NOT_THINKING,
     None, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4430
    ("I'm\nthinking</think><tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>",
     THINKING, None, "I'm\nthinking", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4442
    ("<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>"
     "<tool_call>special_function_with_opt<arg_key>arg1</arg_key><arg_value>1</arg_value>"
     "<arg_key>arg2</arg_key><arg_value>2</arg_value></tool_call>", NOT_THINKING, None, None,
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # test-chat.cpp:4468 (#20650: a call without arguments)
    ("Let me read the diff content.</think><tool_call>read_file_diff_md</tool_call>", THINKING, None,
     "Let me read the diff content.", [("read_file_diff_md", {})]),
])
def test_llama_cpp_glm_4_7_parses(text, prompt, content, reasoning, calls):
    assert summary(read_everywhere(text, prompt)) == (content, reasoning, calls, None)


def test_values_keep_marker_text_and_whitespace():
    text = ("<tool_call>write_file<arg_key>path</arg_key><arg_value> a.md\n</arg_value><arg_key>content</arg_key>"
            "<arg_value>Wrap it in <tool_call> and </tool_call>.</arg_value></tool_call>")
    parsed = read_everywhere(text, NOT_THINKING)
    arguments = {"path": " a.md\n", "content": "Wrap it in <tool_call> and </tool_call>."}
    assert summary(parsed) == (None, None, [("write_file", arguments)], None)


@pytest.mark.parametrize("text", [
    "Sure.<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value>",
    "Sure.<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1",
    "Sure.<tool_call>special_func",
])
def test_a_cut_off_call_is_dropped_with_an_error(text):
    parsed = read_everywhere(text, NOT_THINKING)
    assert (parsed.tool_calls, parsed.content, parsed.error) == ((), "Sure.", CUT_OFF)
    # While it streamed (before the end settled it), no marker was shown as content.
    parser = output_parser(template=template("GLM-4.7-Flash.jinja"), tools=TOOLS, prompt=NOT_THINKING)
    shown = "".join(delta.text for piece in text for delta in parser.feed(piece) if isinstance(delta, TextDelta))
    assert shown == "Sure." and not any(marker in shown for marker in MARKERS)
