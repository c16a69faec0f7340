"""The qwen3-xml family (Qwen3-Coder, Qwen3.5+, Nemotron 3 Nano, StepFun 3.5):
<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>.
Expected parses copied from llama.cpp's tests/test-chat.cpp (vendored llama.cpp)."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "qwen3-xml"
THINKING = "<|im_start|>assistant\n<think>\n"  # the Qwen3.5 generation prompt, thinking on
NOT_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
CODER = "<|im_start|>assistant\n"


def call(function: str, **values: str) -> str:
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in values.items())
    return f"<tool_call>\n<function={function}>\n{parameters}</function>\n</tool_call>"


@pytest.mark.parametrize("template", [
    "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "StepFun3.5-Flash.jinja"])
def test_the_xml_templates_are_detected(template):
    assert detected(template) == FAMILY


@pytest.mark.parametrize("template", [
    "Qwen-Qwen3-0.6B.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja", "MiMo-VL.jinja", "Reka-Edge.jinja"])
def test_the_json_in_tool_call_templates_stay_hermes(template):
    assert detected(template) == "hermes"


HELLO = "Hello, world!\nWhat's up?"
ARG1 = [("special_function", {"arg1": 1})]


@pytest.mark.parametrize("prompt, text, content, reasoning, calls", [
    # test-chat.cpp:2150 (Qwen3.5-4B)
    (THINKING, "I'm\nthinking\n</think>\n\n" + HELLO, HELLO, "I'm\nthinking", []),
    # test-chat.cpp:2162
    (NOT_THINKING, call("special_function", arg1="1"), None, None, ARG1),
    # test-chat.cpp:2174
    (THINKING, "I'm\nthinking\n</think>\n\n" + call("special_function", arg1="1"), None, "I'm\nthinking", ARG1),
    # test-chat.cpp:2186 (parallel calls)
    (NOT_THINKING, call("special_function", arg1="1") + "\n" + call("special_function_with_opt", arg1="1", arg2="2"),
     None, None, ARG1 + [("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # test-chat.cpp:2210 (multi-line code)
    (NOT_THINKING, call("python", code='def hello():\n    print("Hello, world!")\n\nhello()'), None, None,
     [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    # test-chat.cpp:2260 (a value ending in a newline: one newline on each side is markup)
    (NOT_THINKING, call("edit", filename="foo.c", oldString="#iclunde", newString="#include\n"), None, None,
     [("edit", {"filename": "foo.c", "oldString": "#iclunde", "newString": "#include\n"})]),
    # test-chat.cpp:2287 (leading indentation is kept)
    (NOT_THINKING, call("python", code='    print("Hello, world!")'), None, None,
     [("python", {"code": '    print("Hello, world!")'})]),
    # test-chat.cpp:2317 (a tool call ends the prefilled thinking block without </think>)
    (THINKING, "Need to inspect the current directory.\n" + call("run_in_terminal", command="pwd"), None,
     "Need to inspect the current directory.", [("run_in_terminal", {"command": "pwd"})]),
    # test-chat.cpp:2334 (no arguments)
    (NOT_THINKING, "<tool_call>\n<function=empty_args>\n</function>\n</tool_call>", None, None, [("empty_args", {})]),
    # test-chat.cpp:2469
    (THINKING, "I should inspect the directory.\n</think>\n\nLet me inspect it now.\n"
     + call("run_in_terminal", command="pwd"), "Let me inspect it now.", "I should inspect the directory.",
     [("run_in_terminal", {"command": "pwd"})]),
    # test-chat.cpp:2716 (Nemotron 3 Nano: </think> then a single newline)
    (THINKING, "I'm\nthinking\n</think>\n" + call("special_function", arg1="1") + "\n", None, "I'm\nthinking", ARG1),
    # test-chat.cpp:3570 (Qwen3-Coder: the opening <tool_call> left out)
    (CODER, "<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
     None, None, ARG1),
    # test-chat.cpp:3581 (... after some text)
    (CODER, "Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n"
     "</tool_call>", "Let me call it.", None, ARG1),
    # test-chat.cpp:3675 (HTML in a value)
    (CODER, call("html", markup="<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>"), None, None,
     [("html", {"markup": "<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>"})]),
    # test-chat.cpp:3715 (an array of objects)
    (CODER, call("todo_list", todos='[{"item": "Check stuff", "selected": false}, '
                                    '{"item": "Prepare stuff", "selected": true}]'), None, None,
     [("todo_list", {"todos": [{"item": "Check stuff", "selected": False},
                               {"item": "Prepare stuff", "selected": True}]})]),
    # test-chat.cpp:3832, 3858 (nullable types), 3871, 3884 (unions with string), 3898 (enum, no type)
    (CODER, call("set_nullable_str", name="hello world"), None, None, [("set_nullable_str", {"name": "hello world"})]),
    (CODER, call("set_nullable_str", name="null"), None, None, [("set_nullable_str", {"name": None})]),
    (CODER, call("set_union", value='{"a": 1}', amount="2 dollars"), None, None,
     [("set_union", {"value": {"a": 1}, "amount": "2 dollars"})]),
    (CODER, call("set_union", value="{not valid json", amount="42"), None, None,
     [("set_union", {"value": "{not valid json", "amount": 42})]),
    (CODER, call("set_unit", unit="celsius"), None, None, [("set_unit", {"unit": "celsius"})]),
    # test-chat.cpp:6615 (StepFun 3.5: numeric-looking strings stay strings)
    (THINKING, "Let me call the magic tool\n</think>\n" + call("magic", name="fooBar", ref="5123123"), None,
     "Let me call the magic tool", [("magic", {"name": "fooBar", "ref": "5123123"})]),
])
def test_llama_cpp_parses(prompt, text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_markers_inside_a_value_are_text():
    value = "Close tags inline: </parameter> and </function> and <parameter=path> are text; <tool_call> too."
    parsed = read_everywhere(call("python", code=value) + "after", FAMILY, CODER)
    assert calls_of(parsed) == [("python", {"code": value})] and parsed.content == "after"


def test_python_literals_follow_the_schema():
    # The Qwen3-Coder-30B template writes booleans with Python's str.
    parsed = read_everywhere(call("set_alarm", hour="7", repeat="True", label="None"), FAMILY, CODER)
    assert calls_of(parsed) == [("set_alarm", {"hour": 7, "repeat": True, "label": None})]


def test_a_forgotten_parameter_close_ends_at_the_next_tag():
    text = ("<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.c\n<parameter=oldString>\na\n</parameter>\n"
            "<parameter=newString>\nb\n</function>\n</tool_call>")
    parsed = read_everywhere(text, FAMILY, CODER)
    assert calls_of(parsed) == [("edit", {"filename": "foo.c", "oldString": "a", "newString": "b"})]


@pytest.mark.parametrize("text, content", [
    ("Let me check.\n<tool_call>\n<function=python>\n<parameter=code>\nprint(", "Let me check."),
    ("<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\n</parameter>\n", None),
    ("<tool_call>\n<function=pyth", None),
    ("<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n", None),
])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere(text, FAMILY, CODER)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF
    assert parsed.content == content
    _, shown = streamed(FAMILY, list(text), CODER)
    assert "<tool_call>" not in shown and "<function=" not in shown


def test_a_call_cut_off_at_its_opener_gives_no_content():
    parsed = read_everywhere("Thinking.\n</think>\n\n<tool_call>", FAMILY, THINKING)
    assert (parsed.content, parsed.reasoning, parsed.tool_calls, parsed.error) == (None, "Thinking.", (), CUT_OFF)


def test_reasoning_cut_off_is_reasoning():
    parsed = read_everywhere("The user wants the weather, so I", FAMILY, THINKING)
    assert (parsed.content, parsed.reasoning, parsed.error) == (None, "The user wants the weather, so I", None)


def test_a_block_that_is_not_xml_is_content_and_the_next_call_is_read():
    bad = '<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>'
    parsed = read_everywhere(bad + "\n" + call("special_function", arg1="1"), FAMILY, CODER, markers_are_text=True)
    assert parsed.content == bad and calls_of(parsed) == ARG1 and parsed.error


def test_a_function_tag_in_prose_is_text():
    text = "Write it as\n<function=name> on its own line.\nDone."
    parsed = read_everywhere(text, FAMILY, CODER, markers_are_text=True)
    assert (parsed.content, parsed.tool_calls, parsed.error) == (text, (), None)


def test_reasoning_that_mentions_the_call_opener_goes_on():
    text = "I could use <tool_call> here.\n</think>\n\n" + call("special_function", arg1="1")
    parsed = read_everywhere(text, FAMILY, THINKING, markers_are_text=True)
    assert (parsed.reasoning, calls_of(parsed)) == ("I could use <tool_call> here.", ARG1)
