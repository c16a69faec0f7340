"""The Mistral family (read by multiseq.tools.parsers): its templates are detected, llama.cpp's
own expected parses (tests/test-chat.cpp) come out the same whole and one character at a time --
v3's JSON array, v11's `name[ARGS]{...}` with and without `[CALL_ID]id`, several calls in a row,
Magistral's [THINK] reasoning -- and a cut-off call is never a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.tools import read_output
from multiseq.tools.families import detect
from multiseq.tools.family import CUT_OFF

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]")


def read(text: str, pieces: bool = False):
    return read_output(list(text) if pieces else text, "mistral", prompt="[/INST]")


def summary(parsed) -> tuple:
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls])


@pytest.mark.parametrize("name", ["Mistral-Small-3.2-24B-Instruct-2506.jinja",
                                  "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                                  "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                                  "unsloth-mistral-Devstral-Small-2507.jinja"])
def test_the_mistral_templates_are_detected(name):
    assert detect((TEMPLATES / name).read_text()).name == "mistral"


HELLO = "Hello, world!\nWhat's up?"
ARG1 = ("special_function", {"arg1": 1})
LLAMA_CPP_CASES = [  # (test-chat.cpp line, output, content, reasoning, calls)
    (2618, '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', None, None, [ARG1]),
    (2626, "[THINK]I'm\nthinking[/THINK]" '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', None, "I'm\nthinking",
     [ARG1]),
    (2634, '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
           '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}',
     None, None, [ARG1, ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    (2611, "[THINK]I'm\nthinking[/THINK]" + HELLO, HELLO, "I'm\nthinking", []),
    (2661, '[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
           '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', None,
     'Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more', [ARG1]),
    (5916, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]', None, None,
     [ARG1]),
    (6254, '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', None, None, [ARG1]),
    (6260, '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
           '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}', None, None,
     [ARG1, ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    (6284, HELLO, HELLO, None, []),
    (6290, HELLO + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', HELLO, None, [ARG1]),
]


@pytest.mark.parametrize("line, text, content, reasoning, calls", LLAMA_CPP_CASES,
                         ids=[str(case[0]) for case in LLAMA_CPP_CASES])
def test_llama_cpps_expected_parses_whole_and_one_character_at_a_time(line, text, content, reasoning, calls):
    whole = read(text)
    assert summary(whole) == (content, reasoning, calls) and whole.error is None
    assert summary(read(text, pieces=True)) == summary(whole)


def test_magistral_2506s_think_written_as_text_is_reasoning():
    assert summary(read("<think>r</think>c", pieces=True)) == ("c", "r", [])


def test_an_output_cut_off_in_think_is_all_reasoning():
    assert summary(read("[THINK]The user wants", pieces=True)) == (None, "The user wants", [])


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS]write_file[ARGS]{"path": "/tmp/a", "content": "rm -rf /',
    "[TOOL_CALLS]write_fi",
    '[TOOL_CALLS]f[CALL_ID]12345',
    '[TOOL_CALLS][{"name": "f", "arguments": {"a":',
])
def test_a_cut_off_call_is_dropped_with_an_error_never_a_call(text):
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content is None


def test_a_call_cut_off_after_whole_calls_is_dropped_and_the_whole_ones_kept():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{"query": "caf'
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert summary(parsed) == (None, None, [("get_weather", {"city": "Paris"})]) and parsed.error == CUT_OFF


def test_an_output_ending_at_the_call_marker_leaves_no_marker_in_content():
    text = "[THINK]Weather wanted.[/THINK]Let me check that for you.[TOOL_CALLS]"
    for pieces in (False, True):
        parsed = read(text, pieces=pieces)
        assert summary(parsed) == ("Let me check that for you.", "Weather wanted.", [])
        assert not any(marker in (parsed.content or "") for marker in MARKERS)
