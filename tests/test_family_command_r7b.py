"""The command-r7b family (Cohere Command R7B, Cohere2 MoE): <|START_ACTION|>[...]<|END_ACTION|>,
<|START_THINKING|>, <|START_RESPONSE|> / <|START_TEXT|>. Expected parses copied from llama.cpp's
tests/test-chat.cpp."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools.family import CUT_OFF

FAMILY = "command-r7b"
# Cohere2 MoE's generation prompt ends inside the thinking block (Cohere2MoE.jinja's last line).
MOE_PROMPT = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>"
R7B_NO_THINKING_PROMPT = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"
CALL = ('<|START_ACTION|>[\n'
        '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n'
        ']<|END_ACTION|>')


def test_templates_are_detected():
    assert detected("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja") == FAMILY
    assert detected("Cohere2MoE.jinja") == FAMILY


@pytest.mark.parametrize("text, prompt, content, reasoning, calls", [
    # test-chat.cpp:2822
    ("<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>", "", "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:2824
    ("<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
     "", "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # test-chat.cpp:2837
    ("<|START_THINKING|>I'm\nthinking<|END_THINKING|>" + CALL, "", None, "I'm\nthinking",
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:2857
    ("<|START_THINKING|><|END_THINKING|>" + CALL, "", None, None, [("special_function", {"arg1": 1})]),
    # The R7B template without thinking writes the empty block itself.
    ("<|START_RESPONSE|>Hello<|END_RESPONSE|>", R7B_NO_THINKING_PROMPT, "Hello", None, []),
    # Cohere2 MoE, test-chat.cpp:2876
    ("I'm\nthinking<|END_THINKING|><|START_TEXT|>Hello, world!\nWhat's up?<|END_TEXT|>", MOE_PROMPT,
     "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    # test-chat.cpp:2887
    ("<|END_THINKING|><|START_TEXT|>Hello, world!\nWhat's up?<|END_TEXT|>", MOE_PROMPT,
     "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:2905
    ("I'm\nthinking<|END_THINKING|>" + CALL, MOE_PROMPT, None, "I'm\nthinking", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:2927
    ('<|END_THINKING|><|START_ACTION|>[\n'
     '    {"tool_call_id": "0", "tool_name": "todo_list", "parameters": {"todos": ["buy milk", "walk dog"]}}\n'
     ']<|END_ACTION|>', MOE_PROMPT, None, None, [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    # test-chat.cpp:2938
    ("I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
     '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}},\n'
     '    {"tool_call_id": "1", "tool_name": "python", "parameters": {"code": "print(\'hey\')"}}\n'
     "]<|END_ACTION|>", MOE_PROMPT, None, "I'm\nthinking",
     [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
    # A model that calls without closing its thinking (Cohere2 MoE's parser allows it).
    ("Let me call." + CALL, MOE_PROMPT, None, "Let me call.", [("special_function", {"arg1": 1})]),
])
def test_llama_cpp_parses(text, prompt, content, reasoning, calls):
    parsed = read_everywhere(text, FAMILY, prompt=prompt)
    assert (parsed.content, parsed.reasoning, calls_of(parsed)) == (content, reasoning, calls)
    assert parsed.error is None


def test_a_cut_off_call_is_dropped_with_an_error():
    # test-chat.cpp:2847 (a partial call: llama.cpp streams its name; at the end it is no call)
    text = ("<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
            '    {"tool_call_id": "0", "tool_name": "special_function", ')
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.reasoning == "I'm\nthinking"
    assert parsed.content is None  # neither <|START_ACTION|> nor the call as written
    _, shown = streamed(text, FAMILY, list(text))
    assert "<|START_ACTION|>" not in shown


def test_an_action_that_is_not_json_is_content():
    text = "<|START_ACTION|>[{tool_name: special_function}]<|END_ACTION|>"
    parsed = read_everywhere(text, FAMILY)
    assert parsed.tool_calls == () and parsed.error and parsed.content == text
