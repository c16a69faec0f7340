"""The command-r-plus family (Cohere Command R+): "Action:" and a fenced JSON list of
{"tool_name", "parameters"}. Expected parses copied from llama.cpp's tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import TOOLS, calls_of, detected, read_everywhere, streamed

from multiseq.tools import Tool
from multiseq.tools.family import CUT_OFF

FAMILY = "command-r-plus"
HELLO = "Hello, world!\nWhat's up?"
# As the template writes calls back into the history (CohereForAI-c4ai-command-r-plus-tool_use.jinja:164).
TEMPLATE_CALLS = ('Action:\n```json\n[\n    {\n        "tool_name": "special_function",\n        "parameters": {\n'
                  '            "arg1": 1\n        }\n    },\n    {\n        "tool_name": "python",\n'
                  '        "parameters": {"code": "print(1)"}\n    }\n]```\n')


def test_the_template_is_detected_and_r7b_is_not():
    assert detected("CohereForAI-c4ai-command-r-plus-tool_use.jinja") == FAMILY
    assert detected("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja") == "command-r7b"
    assert detected("Cohere2MoE.jinja") == "command-r7b"


@pytest.mark.parametrize("text, content, calls", [
    # test-chat.cpp:5893
    ("<|CHATBOT_TOKEN|>" + HELLO + "<|END_OF_TURN_TOKEN|>", HELLO, []),
    # test-chat.cpp:5895
    ('Action:\n```json\n[{"tool_name": "special_function", "parameters": {"arg1": 1}}]\n```', None,
     [("special_function", {"arg1": 1})]),
    ("I will run it.\n" + TEMPLATE_CALLS, "I will run it.",
     [("special_function", {"arg1": 1}), ("python", {"code": "print(1)"})]),
    # "Action:" that no code fence follows is text.
    ("Action: none needed.\n" + HELLO, "Action: none needed.\n" + HELLO, []),
])
def test_parses(text, content, calls):
    parsed = read_everywhere(text, FAMILY)
    assert (parsed.content, parsed.reasoning, calls_of(parsed), parsed.error) == (content, None, calls, None)


def test_directly_answer_is_no_call_unless_offered():
    text = 'Action:\n```json\n[{"tool_name": "directly-answer", "parameters": {}}]\n```'
    assert read_everywhere(text, FAMILY).tool_calls == ()
    offered = read_everywhere(text, FAMILY, tools=(*TOOLS, Tool("directly-answer")))
    assert calls_of(offered) == [("directly-answer", {})]


@pytest.mark.parametrize("text, content", [
    ('Sure.\nAction:\n```json\n[{"tool_name": "special_function", "parameters": {"ar', "Sure."),
    ("Action:\n```json\n[", None),
])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == content
    _, shown = streamed(text, FAMILY, list(text))
    assert "```" not in shown and "Action:" not in shown


def test_a_fenced_block_that_is_not_calls_is_content_with_an_error():
    text = 'Action:\n```json\n{"answer": 42}\n```'
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error is not None and parsed.content.startswith("Action:")
