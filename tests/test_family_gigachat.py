"""The gigachat family (GigaChat 3: a `function call` message; GigaChat 3.1: <|function_call|>),
one JSON call of "name" and "arguments". Expected parses copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed, template

from multiseq.tools.families import family_named
from multiseq.tools.family import CUT_OFF

FAMILY = "gigachat"
HELLO = "Hello, world!\nWhat's up?"
CALL = '{"name": "special_function", "arguments": {"arg1": 1}}'
V3 = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
V31 = "<|function_call|>"


def test_templates_are_detected_with_their_variants():
    family = family_named(FAMILY)
    assert detected("GigaChat3-10B-A1.8B.jinja") == FAMILY and detected("GigaChat3.1-10B-A1.8B.jinja") == FAMILY
    assert family.variant_of(template("GigaChat3-10B-A1.8B.jinja")) == "gigachat3"
    assert family.variant_of(template("GigaChat3.1-10B-A1.8B.jinja")) == "gigachat3.1"


@pytest.mark.parametrize("text, content, calls", [
    # test-chat.cpp:6817 and 6845
    (HELLO, HELLO, []),
    # test-chat.cpp:6818
    (V3 + CALL, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:6825
    (HELLO + V3 + CALL, HELLO, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:6846
    (V31 + CALL, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:6853
    (HELLO + V31 + CALL, HELLO, [("special_function", {"arg1": 1})]),
    # The templates close the call's message with the separator.
    (HELLO + V3 + CALL + "<|message_sep|>\n\n", HELLO, [("special_function", {"arg1": 1})]),
    (HELLO + V31 + CALL + "<|message_sep|>\n\n", HELLO, [("special_function", {"arg1": 1})]),
    # A message that no call follows ends the output.
    (HELLO + "<|message_sep|>\n\nuser<|role_sep|>\nmore", HELLO, []),
])
def test_llama_cpp_parses(text, content, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed), parsed.error) == (content, None, calls, None)


@pytest.mark.parametrize("text, content", [(HELLO + V3 + CALL[:20], HELLO),
                                           (V31 + '{"name": "special_function", "argu', None)])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.tool_calls, parsed.content, parsed.error) == ((), content, CUT_OFF)
    _, shown = streamed(text, FAMILY, list(text))
    assert "<|message_sep|>" not in shown and V31 not in shown


def test_a_call_that_is_not_json_is_content_with_an_error():
    text = V31 + "special_function(arg1=1)"
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error is not None and parsed.content == text
