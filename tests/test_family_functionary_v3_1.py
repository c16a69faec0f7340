"""The functionary-v3.1 family: <function=NAME>{...}</function>, <|python_tag|>code. Expected parses
copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "functionary-v3.1"


def test_template_is_detected_before_llama3():
    assert detected("meetkai-functionary-medium-v3.1.jinja") == FAMILY
    assert detected("meta-llama-Llama-3.1-8B-Instruct.jinja") == "llama3"


@pytest.mark.parametrize("text, content, calls", [
    # test-chat.cpp:5933
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    # test-chat.cpp:5934
    ('<function=special_function>{"arg1": 1}</function>', None, [("special_function", {"arg1": 1})]),
    # llama.cpp's earlier Functionary v3.1 parser (common_chat_parse_functionary_v3_1_llama_3_1)
    ('Hello, world!\nWhat\'s up?<function=special_function>{"arg1": 1}</function>', "Hello, world!\nWhat's up?",
     [("special_function", {"arg1": 1})]),
    ("<|python_tag|>print('hey')", None, [("python", {"code": "print('hey')"})]),
    ("<|python_tag|>print('hey')<|eom_id|>", None, [("python", {"code": "print('hey')"})]),
    ('<function=special_function>{"arg1": 1}</function><function=special_function_with_opt>{"arg1": 1, "arg2": 2}'
     '</function>', None, [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ('<function=get_time>{"city": "Paris"}</function><|eom_id|>', None, [("get_time", {"city": "Paris"})]),
])
def test_llama_cpp_parses(text, content, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, None, calls)
    assert parsed.error is None


@pytest.mark.parametrize("text", ['<function=special_function>{"arg1": 1}', "<function=special_fun"])
def test_a_cut_off_call_is_dropped_with_an_error(text):
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None
    _, shown = streamed(text, FAMILY, list(text))
    assert shown == ""


def test_arguments_that_are_not_json_are_content():
    text = "<function=special_function>arg1=1</function>"
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text
