"""The functionary-v3.2 family: >>>NAME\\n{...} messages, >>>all\\n text. Expected parses copied from
llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "functionary-v3.2"


def test_template_is_detected():
    assert detected("meetkai-functionary-medium-v3.2.jinja") == FAMILY


@pytest.mark.parametrize("text, content, calls", [
    # test-chat.cpp:5951
    ("all\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    # test-chat.cpp:5952
    ('special_function\n{"arg1": 1}', None, [("special_function", {"arg1": 1})]),
    # llama.cpp's earlier Functionary v3.2 parser (common_chat_parse_functionary_v3_2)
    ("all\nHello, world!\nnono\nWhat's up?>>>special_function\n{\"arg1\": 1}\n", "Hello, world!\nnono\nWhat's up?",
     [("special_function", {"arg1": 1})]),
    ("python\n# This is a program:\nprint('hey')", None, [("python", {"code": "# This is a program:\nprint('hey')"})]),
    ('special_function\n{"arg1": 1} \n                    ', None, [("special_function", {"arg1": 1})]),
    # Several calls, and a ">>>" the prompt left to the model
    ('>>>special_function\n{"arg1": 1}>>>special_function_with_opt\n{"arg1": 1, "arg2": 2}', None,
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ('all\nLet me check.>>>get_time\n{"city": "Paris"}<|eot_id|>', "Let me check.", [("get_time", {"city": "Paris"})]),
    # Plain text with no recipient line is content
    ("Hello", "Hello", []),
])
def test_llama_cpp_parses(text, content, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, None, calls)
    assert parsed.error is None


@pytest.mark.parametrize("text, content", [('special_function\n{"arg1": ', None),
                                           ('all\nOne moment.>>>special_function\n{"arg', "One moment.")])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == content
    _, shown = streamed(text, FAMILY, list(text))
    assert "special_function" not in shown and ">>>" not in shown


def test_arguments_that_are_not_json_are_content():
    text = "all\nSure.>>>special_function\narg1=1"
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error and parsed.content == "Sure.>>>special_function\narg1=1"
