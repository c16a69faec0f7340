"""The minimax-m2 family (MiniMax M2, M2.1, M2.5): <minimax:tool_call> blocks of
<invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke>, reasoning in <think>.
Expected parses copied from llama.cpp's tests/test-chat.cpp (vendored llama.cpp)."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "minimax-m2"
PROMPT = "]~b]ai\n<think>\n"  # the template's generation prompt opens the reasoning
HELLO = "Hello, world!\nWhat's up?"


def block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


def invoke(function: str, **values: str) -> str:
    parameters = "".join(f'<parameter name="{key}">{value}</parameter>\n' for key, value in values.items())
    return f'<invoke name="{function}">\n{parameters}</invoke>\n'


def test_the_m2_template_is_detected_and_m1_m3_are_not():
    assert detected("MiniMax-M2.jinja") == FAMILY
    # M1 writes JSON in <tool_calls>; M3 namespaced tags (]<]minimax[>[<invoke name=...>).
    assert detected("MiniMax-M1.jinja") != FAMILY and detected("MiniMax-M3.jinja") != FAMILY


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:5443
    ("\n</think>\n\n" + HELLO, HELLO, None, []),
    # test-chat.cpp:5445
    ("I'm\nthinking\n</think>\n\n" + HELLO, HELLO, "I'm\nthinking", []),
    # test-chat.cpp:5447
    ('Let\'s call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name="empty_args">\n</invoke>\n'
     "</minimax:tool_call>", None, "Let's call a tool:", [("empty_args", {})]),
    # test-chat.cpp:5454
    ('\n</think>\n\n<minimax:tool_call>\n<invoke name="special_function">\n<parameter name="arg1">1</parameter>\n'
     "</invoke>\n</minimax:tool_call>", None, None, [("special_function", {"arg1": 1})]),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_several_invokes_in_one_block_and_text_before():
    text = ("Checking.\n</think>\n\nLet me look.\n"
            + block(invoke("special_function_with_opt", arg1="1", arg2="2"),
                    invoke("todo_list", todos='[{"item": "a", "selected": false}]')))
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning) == ("Let me look.", "Checking.")
    assert calls_of(parsed) == [("special_function_with_opt", {"arg1": 1, "arg2": 2}),
                                ("todo_list", {"todos": [{"item": "a", "selected": False}]})]


def test_values_are_text_with_one_newline_of_markup_on_each_side():
    code = 'def f():\n    return "</parameter> and </invoke> are text"\n'
    text = "</think>" + block(invoke("python", code="\n" + code + "\n"), invoke("edit", filename=" a b "))
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert calls_of(parsed) == [("python", {"code": code}), ("edit", {"filename": " a b "})]


def test_a_call_cut_off_in_the_second_invoke_keeps_the_first():
    text = "</think>\n" + block(invoke("special_function", arg1="1"))[:-len("</minimax:tool_call>")] \
        + '<invoke name="python">\n<parameter name="code">print('
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert calls_of(parsed) == [("special_function", {"arg1": 1})] and parsed.error == CUT_OFF
    assert parsed.content is None  # the cut-off invoke is dropped, not shown as its markup


@pytest.mark.parametrize("text, content", [
    ('Sure.\n<minimax:tool_call>\n<invoke name="python">\n<parameter name="code">print(1)</parameter>\n', "Sure."),
    ('<minimax:tool_call>\n<invoke name="pyth', None),
])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere("</think>" + text, FAMILY, PROMPT)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == content
    _, shown = streamed(FAMILY, list("</think>" + text), PROMPT)
    assert "<minimax:tool_call>" not in shown


def test_the_end_of_turn_token_ends_the_output():
    parsed = read_everywhere("Done.\n</think>\n\nHi![e~[\n]~b]user\nmore", FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning) == ("Hi!", "Done.")
