"""The gpt-oss family (Harmony channels): its template is detected, llama.cpp's own expected
parses come out the same whole and streamed one character at a time, and calls that were cut
off or cannot be read are content with an error, never calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import ParsedOutput, Tool, read_output
from multiseq.tools.families import detect
from multiseq.tools.families.gpt_oss import FAMILY
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
PROMPT = "<|start|>assistant"  # the template's generation prompt: outputs begin in a header

SPECIAL_FUNCTION = Tool("special_function", "I'm special", {
    "type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]})
EDIT = Tool("edit", "Edit a file", {
    "type": "object", "required": ["oldString", "newString"],
    "properties": {"oldString": {"type": "string"}, "newString": {"type": "string"},
                   "replaceAll": {"type": "boolean"}}})
TOOLS = (SPECIAL_FUNCTION, EDIT)

ASSIST = "Hello, world!\nWhat's up?"
THINKING = "I'm\nthinking"


def read(text: str | list[str], prompt: str = PROMPT) -> ParsedOutput:
    return read_output(text, "gpt-oss", tools=TOOLS, prompt=prompt, call_id=lambda index: f"call_{index}")


def read_both_ways(text: str, prompt: str = PROMPT) -> ParsedOutput:
    """The whole text, and the same text one character at a time, must read the same."""
    whole = read(text, prompt)
    assert read(list(text), prompt) == whole
    return whole


def summary(parsed: ParsedOutput) -> tuple:
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls])


def test_the_gpt_oss_template_is_detected():
    assert detect((TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()) is FAMILY
    assert detect((TEMPLATES / "ByteDance-Seed-OSS.jinja").read_text()) is not FAMILY


def test_a_prompt_that_opened_the_analysis_channel_starts_in_reasoning():
    assert FAMILY.opens_reasoning("<|start|>assistant<|channel|>analysis<|message|>")
    assert not FAMILY.opens_reasoning(PROMPT)
    parsed = read_both_ways("I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hi",
                            prompt="<|start|>assistant<|channel|>analysis<|message|>")
    assert summary(parsed) == ("Hi", THINKING, [])


# llama.cpp's expected parses, tests/test-chat.cpp ("GPT-OSS format tests"), as literal cases.
LLAMA_CPP_CASES = [
    # test-chat.cpp:6428  Basic content only - final channel
    ("<|channel|>final<|message|>Hello, world!\nWhat's up?", (ASSIST, None, [])),
    # test-chat.cpp:6431  Basic content only - commentary channel
    ("<|channel|>commentary<|message|>Hello, world!\nWhat's up?", (ASSIST, None, [])),
    # test-chat.cpp:6434  Analysis channel (reasoning) with final channel (content)
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", (ASSIST, THINKING, [])),
    # test-chat.cpp:6450  Analysis channel only (partial)
    ("<|channel|>analysis<|message|>I'm\nthinking", (None, THINKING, [])),
    # test-chat.cpp:6457  Tool call with recipient in role header
    (" to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
     (None, None, [("special_function", {"arg1": 1})])),
    # test-chat.cpp:6464  Tool call with recipient in channel header
    ("<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
     (None, None, [("special_function", {"arg1": 1})])),
    # test-chat.cpp:6471  Tool call with constraint
    (" to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
     (None, None, [("special_function", {"arg1": 1})])),
    # test-chat.cpp:6478  Tool call in commentary channel (channel header variant)
    ("<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
     (None, None, [("special_function", {"arg1": 1})])),
    # test-chat.cpp:6485  Tool call with reasoning + content (analysis first, then tool call)
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|>"
     "<|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
     (None, THINKING, [("special_function", {"arg1": 1})])),
    # test-chat.cpp:6494  Complex tool calling
    ("<|channel|>analysis<|message|>Thinking about edit...<|end|>"
     "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json"
     "<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", "
     "\"replaceAll\": false}",
     (None, "Thinking about edit...",
      [("edit", {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False})])),
    # test-chat.cpp:6531  Structured output (a content type on the final channel)
    ("<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|>"
     "<|start|>assistant<|channel|>final <|constrain|>json<|message|>{\"amount\": 123.45, \"date\": \"2025-12-03\"}",
     ('{"amount": 123.45, "date": "2025-12-03"}', "I need to output the invoice details in JSON", [])),
    # test-chat.cpp:6547  Unsolicited builtin call, recipient in role: empty content
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
     "<|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
     (None, "I will execute python to say hello", [])),
    # test-chat.cpp:6556  Unsolicited builtin call, recipient in channel: empty content
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
     "<|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
     (None, "I will execute python to say hello", [])),
    # test-chat.cpp:6567  "<|channel|>commentary to=assistant" before reasoning
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", (ASSIST, THINKING, [])),
    # test-chat.cpp:6575  "<|channel|>commentary to=assistant" before final message
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", (ASSIST, THINKING, [])),
]


@pytest.mark.parametrize("text, expected", LLAMA_CPP_CASES)
def test_llama_cpp_expected_parses(text, expected):
    parsed = read_both_ways(text)
    assert summary(parsed) == expected
    assert parsed.error is None


def test_a_preamble_calls_and_an_answer_after_them():
    text = ("<|channel|>commentary<|message|>Let me look.<|end|>"
            "<|start|>assistant to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}<|call|>"
            "<|start|>assistant<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 2}<|call|>"
            "<|start|>assistant<|channel|>final<|message|>Done.<|return|>")
    parsed = read_both_ways(text)
    assert summary(parsed) == ("Let me look.Done.", None,
                               [("special_function", {"arg1": 1}), ("special_function", {"arg1": 2})])


def test_marker_strings_inside_arguments_and_reasoning_are_text():
    arguments = {"arg1": 1, "note": "a call ends with <|call|>; a message with <|end|>"}
    text = ("<|channel|>analysis<|message|>Never write <|call|> or <|channel|>final here.<|end|>"
            "<|start|>assistant to=functions.special_function<|channel|>commentary<|message|>" + json.dumps(arguments))
    parsed = read_both_ways(text)
    assert summary(parsed) == (None, "Never write <|call|> or <|channel|>final here.",
                               [("special_function", arguments)])


@pytest.mark.parametrize("cut", [
    '{"arg1": ',
    '{"arg1": 1, "note": "it ends with <|call|>',
    "",
])
def test_a_call_cut_off_in_its_arguments_is_dropped_with_an_error(cut):
    text = ("<|channel|>analysis<|message|>Call it.<|end|>"
            "<|start|>assistant to=functions.special_function<|channel|>commentary <|constrain|>json<|message|>" + cut)
    parsed = read_both_ways(text)
    assert parsed.tool_calls == ()
    assert parsed.reasoning == "Call it."
    assert parsed.content is None  # neither the header's markers nor the body as written
    assert parsed.error == CUT_OFF


@pytest.mark.parametrize("cut", ['{"arg1": ', '{"arg1": 1, "note": "it ends with <|call|>'])
def test_a_call_cut_off_after_a_preamble_keeps_the_preamble(cut):
    text = ("<|channel|>commentary<|message|>Let me check.<|end|>"
            "<|start|>assistant to=functions.special_function<|channel|>commentary <|constrain|>json<|message|>" + cut)
    parsed = read_both_ways(text)
    assert (parsed.content, parsed.tool_calls, parsed.error) == ("Let me check.", (), CUT_OFF)


def test_a_call_cut_off_in_its_header_is_no_call():
    parsed = read_both_ways("<|channel|>analysis<|message|>Call it.<|end|>"
                            "<|start|>assistant to=functions.special_function<|channel|>commentary <|constrain|>js")
    assert summary(parsed) == (None, "Call it.", [])


def test_arguments_that_are_no_json_object_are_content_with_an_error():
    parsed = read_both_ways("<|channel|>commentary to=functions.special_function<|message|>[1, 2]<|call|>")
    assert parsed.tool_calls == ()
    assert parsed.content == "[1, 2]"
    assert "not a JSON object" in parsed.error


def test_garbled_headers_are_left_out_and_reading_goes_on():
    parsed = read_both_ways("<|channel|>??<|end|><|start|>assistant<|channel|>analysis<|message|>Thinking.<|end|>"
                            "<|start|>assistant<|channel|>final {\"answer\": \"hi\"}")
    assert summary(parsed) == (None, "Thinking.", [])
