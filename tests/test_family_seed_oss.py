"""The seed-oss family (ByteDance Seed-OSS): <seed:tool_call>\\n<function=NAME>\\n
<parameter=KEY>VALUE</parameter>\\n</function>\\n</seed:tool_call>, reasoning in <seed:think>.
Expected parses copied from llama.cpp's tests/test-chat.cpp (vendored llama.cpp)."""

from __future__ import annotations

import pytest

from xml_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "seed-oss"
PROMPT = "<seed:bos>assistant\n"  # the model opens its reasoning itself
HELLO = "Hello, world!\nWhat's up?"


def call(function: str, **values: str) -> str:
    parameters = "".join(f"<parameter={key}>{value}</parameter>\n" for key, value in values.items())
    return f"<seed:tool_call>\n<function={function}>\n{parameters}</function>\n</seed:tool_call>"


def test_the_seed_template_is_detected():
    assert detected("ByteDance-Seed-OSS.jinja") == FAMILY


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:3447
    (HELLO, HELLO, None, []),
    # test-chat.cpp:3449
    ("<seed:think>I'm thinking about the answer</seed:think>\nHello, world!", "Hello, world!",
     "I'm thinking about the answer", []),
    # test-chat.cpp:3454
    (call("special_function", arg1="1"), None, None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:3464 (parallel calls)
    (call("special_function", arg1="1") + "\n" + call("special_function_with_opt", arg1="1", arg2="2"), None, None,
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # test-chat.cpp:3486 (an array of objects)
    (call("todo_list", todos='[{"item": "Check stuff", "selected": false}, '
                             '{"item": "Prepare stuff", "selected": true}]'), None, None,
     [("todo_list", {"todos": [{"item": "Check stuff", "selected": False},
                               {"item": "Prepare stuff", "selected": True}]})]),
    # test-chat.cpp:3501 (quotes, and a value's own trailing newline is kept: no newline is markup)
    (call("edit", filename="foo.cpp", oldString='def foo(arg = "14"):\n    return arg + "bar"\n',
          newString='def foo(arg = "15"):\n    pass\n'), None, None,
     [("edit", {"filename": "foo.cpp", "oldString": 'def foo(arg = "14"):\n    return arg + "bar"\n',
                "newString": 'def foo(arg = "15"):\n    pass\n'})]),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_reasoning_then_text_then_call_with_a_budget_reflection():
    text = ("<seed:think>Weather first.<seed:cot_budget_reflect>Used 10 tokens.</seed:cot_budget_reflect>"
            "</seed:think>\nLet me check.\n" + call("run_in_terminal", command="pwd"))
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning) == ("Let me check.", "Weather first.Used 10 tokens.")
    assert calls_of(parsed) == [("run_in_terminal", {"command": "pwd"})]


def test_values_rendered_with_python_str():
    # The template writes non-string arguments with `| string`: Python's True and dict repr.
    parsed = read_everywhere(call("set_alarm", hour="7", repeat="True") + call("set_union", value="{'a': 1}",
                                                                                  amount="3"), FAMILY, PROMPT)
    assert calls_of(parsed) == [("set_alarm", {"hour": 7, "repeat": True}),
                                ("set_union", {"value": {"a": 1}, "amount": 3})]


@pytest.mark.parametrize("text, content", [
    ("<seed:tool_call>\n<function=python>\n<parameter=code>print(", None),
    ("Sure.\n<seed:tool_call>\n<function=python>\n<parameter=code>print(1)</parameter>\n", "Sure."),
])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere(text, FAMILY, PROMPT)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == content
    _, shown = streamed(FAMILY, list(text), PROMPT)
    assert "<seed:tool_call>" not in shown


def test_reasoning_cut_off_is_reasoning():
    parsed = read_everywhere("<seed:think>Let me think about", FAMILY, PROMPT)
    assert (parsed.content, parsed.reasoning, parsed.error) == (None, "Let me think about", None)
