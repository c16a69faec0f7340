"""The firefunction-v2 family: functools[{"name": ..., "arguments": {...}}]. Expected parses copied
from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "firefunction-v2"


def test_template_is_detected():
    assert detected("fireworks-ai-llama-3-firefunction-v2.jinja") == FAMILY


@pytest.mark.parametrize("text, content, calls", [
    # test-chat.cpp:5970
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    # test-chat.cpp:5971
    (' functools[{"name": "special_function", "arguments": {"arg1": 1}}]', None, [("special_function", {"arg1": 1})]),
    ('Let me check. functools[{"name": "get_time", "arguments": {"city": "Paris"}}, '
     '{"name": "special_function", "arguments": {"arg1": 1}}]', "Let me check.",
     [("get_time", {"city": "Paris"}), ("special_function", {"arg1": 1})]),
    # Python's functools module is text
    ("Use functools.cache here.", "Use functools.cache here.", []),
])
def test_llama_cpp_parses(text, content, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, None, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    text = ' functools[{"name": "special_function", "arguments": {"arg1": 1}'
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None
    _, shown = streamed(text, FAMILY, list(text))
    assert shown == ""
