"""The minimax-m1 family (MiniMax-M1, MiniMax-Text-01): JSON calls, one a line, in
<tool_calls>...</tool_calls>; reasoning in <think>. llama.cpp's tests/test-chat.cpp has no case
for this template (its autoparser reads it): the cases are the template's own rendering of calls
(MiniMax-M1.jinja: '<tool_calls>\\n' + one '{"name": ..., "arguments": ...}\\n' a call + '</tool_calls>')."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "minimax-m1"
HELLO = "Hello, world!\nWhat's up?"
ONE = '{"name": "special_function", "arguments": {"arg1": 1}}\n'
TWO = '{"name": "python", "arguments": {"code": "print(\'hey\')"}}\n'


def test_the_m1_template_is_detected():
    assert detected("MiniMax-M1.jinja") == FAMILY
    assert detected("MiniMax-M2.jinja") != FAMILY and detected("MiniMax-M3.jinja") != FAMILY
    assert detected("unsloth-Apriel-1.5.jinja") != FAMILY  # Apriel's <tool_calls> holds a list


@pytest.mark.parametrize("text, content, reasoning, calls", [
    (HELLO, HELLO, None, []),
    ("<think>I'm\nthinking</think>\n" + HELLO + "<end_of_sentence>", HELLO, "I'm\nthinking", []),
    ("<tool_calls>\n" + ONE + "</tool_calls>", None, None, [("special_function", {"arg1": 1})]),
    ("<think>\nLet me run both.\n</think>\nSure.\n<tool_calls>\n" + ONE + TWO + "</tool_calls><end_of_sentence>",
     "Sure.", "Let me run both.", [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
    # Arguments the client gave as text: the template's tojson writes them as a JSON string.
    ('<tool_calls>\n{"name": "special_function", "arguments": "{\\"arg1\\": 1}"}\n</tool_calls>', None, None,
     [("special_function", {"arg1": 1})]),
    # A model that calls without closing its thinking.
    ("<think>Calling.\n<tool_calls>\n" + ONE + "</tool_calls>", None, "Calling.", [("special_function", {"arg1": 1})]),
    # A list of calls in the block is read too.
    ("<tool_calls>\n[" + ONE.strip() + ", " + TWO.strip() + "]\n</tool_calls>", None, None,
     [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
])
def test_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed), parsed.error) == (content, reasoning, calls, None)


def test_the_end_of_turn_token_ends_the_output():
    parsed = read_everywhere("Hi!<end_of_sentence>\n<beginning_of_sentence>user name=user\nmore", FAMILY)
    assert parsed.content == "Hi!"


@pytest.mark.parametrize("text, content", [
    ("Sure.\n<tool_calls>\n" + ONE + '{"name": "python", "argu', "Sure."),
    ("<tool_calls>\n{", None),
])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == content
    _, shown = streamed(text, FAMILY, list(text))
    assert "<tool_calls>" not in shown


def test_a_block_that_is_not_calls_is_content_with_an_error():
    text = "<tool_calls>\nspecial_function(arg1=1)\n</tool_calls>"
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error is not None and parsed.content == text
