"""The deepseek family (runner/tools/families/deepseek.py): V3/R1, V3.1 and DSML (V3.2, V4, V4.1).

llama.cpp's own expected parses (tests/test-chat.cpp of the vendored llama.cpp) read through
multiseq.tools.read_output, whole and one character at a time; truncated calls; detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import TextDelta, Tool, ToolCallStart, output_parser, read_output
from multiseq.tools.families import detect, family_named
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
DEEPSEEK_TEMPLATES = {
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "deepseek-v3",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-v3",
    "llama-cpp-deepseek-r1.jinja": "deepseek-v3",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v31",
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek-v32",
    "deepseek-ai-DeepSeek-V4.jinja": "deepseek-v4",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "deepseek-v4",
}

# The generation prompts' ends, as the templates write them.
THINKING = "<｜Assistant｜><think>"
R1 = "<｜Assistant｜><think>\n"
V31_NO_THINKING = "<｜Assistant｜><think></think>"
V4_NO_THINKING = "<｜Assistant｜></think>"

FAMILY = family_named("deepseek")


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def read(text: str, template_name: str, prompt: str = "", tools=()):
    """The output read whole and one character at a time: both the same, the whole returned."""
    def fixed_id(index: int) -> str:
        return f"call_{index}"
    source = template(template_name)
    whole = read_output(text, template=source, prompt=prompt, tools=tools, call_id=fixed_id)
    streamed = read_output(list(text), template=source, prompt=prompt, tools=tools, call_id=fixed_id)
    assert streamed == whole
    return whole


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls]


# --- detection -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DEEPSEEK_TEMPLATES))
def test_templates_are_detected_with_their_sub_format(name):
    source = template(name)
    assert detect(source).name == "deepseek"
    assert FAMILY.variant_of(source) == DEEPSEEK_TEMPLATES[name]


def test_only_deepseek_templates_are_detected_as_deepseek():
    detected = {path.name for path in TEMPLATES.glob("*.jinja") if detect(path.read_text()).name == "deepseek"}
    assert detected == set(DEEPSEEK_TEMPLATES)


@pytest.mark.parametrize("prompt, opens", [(THINKING, True), (R1, True), (V31_NO_THINKING, False),
                                           (V4_NO_THINKING, False), ("<｜Assistant｜>", False)])
def test_generation_prompts_say_whether_the_output_starts_reasoning(prompt, opens):
    assert FAMILY.opens_reasoning(prompt) is opens


# --- llama.cpp's expected parses ----------------------------------------------------------------

LLAMA_CPP_CASES = [
    # test-chat.cpp:3920 (V3.1, thinking off)
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_NO_THINKING,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
     "\"XYZCITY\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     None, None, [("get_time", {"city": "XYZCITY"})]),
    # test-chat.cpp:3953 (V3.1, thinking)
    ("deepseek-ai-DeepSeek-V3.1.jinja", THINKING,
     "REASONING</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
     "\"Tokyo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     None, "REASONING", [("get_time", {"city": "Tokyo"})]),
    # test-chat.cpp:3965 (V3.1, reasoning, content and two calls)
    ("deepseek-ai-DeepSeek-V3.1.jinja", THINKING,
     "REASONING</think>CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
     "\"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
     "\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "CONTENT", "REASONING", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    # test-chat.cpp:3992 (V3.1, content only)
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_NO_THINKING, "CONTENT", "CONTENT", None, []),
    # test-chat.cpp:4022 (V3.2, thinking, string parameter)
    ("deepseek-ai-DeepSeek-V3.2.jinja", THINKING,
     "Let me check the time</think>\n\n"
     "<｜DSML｜function_calls>\n"
     "<｜DSML｜invoke name=\"get_time\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     None, "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    # test-chat.cpp:4036 (V3.2, integer parameter: string="false")
    ("deepseek-ai-DeepSeek-V3.2.jinja", V31_NO_THINKING,
     "<｜DSML｜function_calls>\n"
     "<｜DSML｜invoke name=\"special_function\">\n"
     "<｜DSML｜parameter name=\"arg1\" string=\"false\">1</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     None, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4049 (V3.2, two calls after reasoning)
    ("deepseek-ai-DeepSeek-V3.2.jinja", THINKING,
     "Calling both</think>\n\n"
     "<｜DSML｜function_calls>\n"
     "<｜DSML｜invoke name=\"get_time\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "<｜DSML｜invoke name=\"get_weather\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     None, "Calling both", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    # test-chat.cpp:4069 (V3.2, content before the call)
    ("deepseek-ai-DeepSeek-V3.2.jinja", THINKING,
     "Thinking about it</think>"
     "Let me call the function.\n\n"
     "<｜DSML｜function_calls>\n"
     "<｜DSML｜invoke name=\"special_function\">\n"
     "<｜DSML｜parameter name=\"arg1\" string=\"false\">1</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     "Let me call the function.", "Thinking about it", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4157 (V3.2, object parameter)
    ("deepseek-ai-DeepSeek-V3.2.jinja", THINKING,
     "Test object</think>\n\n"
     "<｜DSML｜function_calls>\n"
     "<｜DSML｜invoke name=\"set_config\">\n"
     "<｜DSML｜parameter name=\"config\" string=\"false\">{\"theme\":\"dark\",\"level\":2}</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     None, "Test object", [("set_config", {"config": {"theme": "dark", "level": 2}})]),
    # test-chat.cpp:4188 (V3.2, mixed parameter types)
    ("deepseek-ai-DeepSeek-V3.2.jinja", THINKING,
     "Multi-arg call</think>\n\n"
     "<｜DSML｜function_calls>\n"
     "<｜DSML｜invoke name=\"magic_int\">\n"
     "<｜DSML｜parameter name=\"ref\" string=\"false\">42</｜DSML｜parameter>\n"
     "<｜DSML｜parameter name=\"name\" string=\"true\">foo bar</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     None, "Multi-arg call", [("magic_int", {"ref": 42, "name": "foo bar"})]),
    # test-chat.cpp:4248 (V4, thinking)
    ("deepseek-ai-DeepSeek-V4.jinja", THINKING,
     "Let me check the time</think>\n\n"
     "<｜DSML｜tool_calls>\n"
     "<｜DSML｜invoke name=\"get_time\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜tool_calls>",
     None, "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    # test-chat.cpp:4353 (V4: the call block ends the reasoning, no </think>)
    ("deepseek-ai-DeepSeek-V4.jinja", THINKING,
     "Let me check the time\n\n"
     "<｜DSML｜tool_calls>\n"
     "<｜DSML｜invoke name=\"get_time\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜tool_calls>",
     None, "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    # test-chat.cpp:4372 (V4-Flash-0731, thinking off)
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", V4_NO_THINKING,
     "\n\n"
     "<｜DSML｜tool_calls>\n"
     "<｜DSML｜invoke name=\"special_function\">\n"
     "<｜DSML｜parameter name=\"arg1\" string=\"false\">1</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n"
     "</｜DSML｜tool_calls>",
     None, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5990 (R1 Distill Llama: the prompt opened the reasoning)
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1, "</think>Hello, world!\nWhat's up?",
     "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:6025 (llama.cpp's R1 template)
    ("llama-cpp-deepseek-r1.jinja", R1, "I'm\nthinking</think>Hello, world!\nWhat's up?",
     "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # test-chat.cpp:6029 (R1: no newline before the closing fence)
    ("llama-cpp-deepseek-r1.jinja", R1,
     "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
     "```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     None, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:6070 (R1 Distill Qwen, thinking off: the prompt closed the reasoning)
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1 + "</think>",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
     "```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     None, None, [("special_function", {"arg1": 1})]),
]


@pytest.mark.parametrize("template_name, prompt, text, content, reasoning, calls", LLAMA_CPP_CASES)
def test_llama_cpp_expected_parses(template_name, prompt, text, content, reasoning, calls):
    parsed = read(text, template_name, prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed), parsed.error) == (content, reasoning, calls, None)


# --- the forms' details ---------------------------------------------------------------------

def test_v3_arguments_holding_markers_and_fences_are_read_as_json():
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>echo\n```json\n"
            "{\"text\": \"Reply as ```json\\n{}\\n``` or use <｜tool▁call▁end｜> tokens.\"}\n```"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    parsed = read(text, "llama-cpp-deepseek-r1.jinja", R1 + "</think>")
    assert calls_of(parsed) == [("echo", {"text": "Reply as ```json\n{}\n``` or use <｜tool▁call▁end｜> tokens."})]
    assert parsed.content is None


def test_dsml_v41_spacing_self_closing_invoke_and_raw_strings():
    text = ("Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"write\">\n"
            "<｜DSML｜ parameter name=\"body\" string=\"true\">  a < b \"q\"\n</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"n\" string=\"false\">1.5</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
            "<｜DSML｜ invoke name=\"submit\"/>\n</｜DSML｜ calls>")
    parsed = read(text, "deepseek-ai-DeepSeek-V4.jinja", V4_NO_THINKING)
    assert parsed.content == "Checking."
    assert calls_of(parsed) == [("write", {"body": "  a < b \"q\"\n", "n": 1.5}), ("submit", {})]


def test_dsml_parameter_without_string_attribute_follows_the_schema():
    tools = [Tool("f", None, {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}})]
    text = ("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\">7</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"s\">7</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    parsed = read(text, "deepseek-ai-DeepSeek-V4.jinja", V4_NO_THINKING, tools)
    assert calls_of(parsed) == [("f", {"n": 7, "s": "7"})]


def test_text_after_the_stop_token_is_not_the_answer():
    parsed = read("Hello<｜end▁of▁sentence｜><｜User｜>more", "deepseek-ai-DeepSeek-V3.1.jinja", V31_NO_THINKING)
    assert (parsed.content, parsed.tool_calls) == ("Hello", ())


def test_the_sub_format_given_by_name_does_not_matter():
    text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    for variant in (None, "deepseek-v3", "deepseek-v31", "deepseek-v32", "deepseek-v41"):
        parsed = read_output(text, "deepseek", variant=variant)
        assert calls_of(parsed) == [("f", {"a": 1})]


# --- truncated and malformed calls ------------------------------------------------------------

TRUNCATED = [
    ("llama-cpp-deepseek-r1.jinja", R1 + "</think>",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Zür"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_NO_THINKING,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zür"),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V31_NO_THINKING,
     "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Zür"),
]


@pytest.mark.parametrize("template_name, prompt, text", TRUNCATED)
def test_a_truncated_call_is_dropped_with_an_error(template_name, prompt, text):
    parsed = read("Let me look. " + text, template_name, prompt)
    assert parsed.tool_calls == ()
    assert parsed.content == "Let me look."
    assert parsed.error == CUT_OFF


@pytest.mark.parametrize("template_name, prompt, text", TRUNCATED)
def test_no_marker_text_streams_as_content_before_the_output_ends(template_name, prompt, text):
    parser = output_parser(template=template(template_name), prompt=prompt)
    deltas = [delta for piece in "Let me look. " + text for delta in parser.feed(piece)]
    assert "".join(delta.text for delta in deltas if isinstance(delta, TextDelta)) == "Let me look."
    assert not any(isinstance(delta, ToolCallStart) for delta in deltas)


def test_a_section_cut_in_its_second_call_keeps_the_first():
    text = ("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n"
            "<｜DSML｜invoke name=\"b\">\n<｜DSML｜parameter name=\"q\"")
    parsed = read(text, "deepseek-ai-DeepSeek-V4.jinja", V4_NO_THINKING)
    assert (calls_of(parsed), parsed.content, parsed.error) == ([("a", {})], None, CUT_OFF)


def test_every_prefix_of_two_calls_gives_only_the_complete_ones():
    first = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜>"
    second = "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"b\": \"<｜tool▁call▁end｜>\"}<｜tool▁call▁end｜>"
    text = "<｜tool▁calls▁begin｜>" + first + second + "<｜tool▁calls▁end｜>"
    source = template("deepseek-ai-DeepSeek-V3.1.jinja")
    for size in range(len(text) + 1):
        parsed = read_output(text[:size], template=source, prompt=V31_NO_THINKING)
        complete = [name for name, end in (("f", len("<｜tool▁calls▁begin｜>" + first)),
                                           ("g", len("<｜tool▁calls▁begin｜>" + first + second))) if size >= end]
        assert [call.name for call in parsed.tool_calls] == complete
        if not complete:  # a prefix of the opening marker is text; a call cut off after it is dropped
            opened = size >= len("<｜tool▁calls▁begin｜>")
            assert parsed.content == (None if opened else text[:size].strip() or None)
            assert parsed.error == (CUT_OFF if opened else None)


def test_a_call_that_cannot_be_read_is_content():
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            "{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    parsed = read(text, "llama-cpp-deepseek-r1.jinja", R1 + "</think>")
    assert (parsed.tool_calls, parsed.content) == ((), text)
    assert parsed.error is not None
