"""Calls constrained in a family's own syntax (runner/tools/grammars.py's family_grammar): the
markers that are control tokens are required as those tokens, JSON arguments follow the
tool's schema, `auto` leaves text free until the trigger, reasoning may come first.

A byte vocabulary with a few control tokens stands in for a model's: a grammar is checked by
feeding an output token by token to an llguidance matcher.
"""

from __future__ import annotations

import llguidance
import pytest

from multiseq.grammar import tokenizer_from_pieces
from multiseq.tools import ChoiceMode, Tool, ToolChoice
from multiseq.tools.family import CallSyntax
from multiseq.tools.grammars import family_grammar

SPECIAL = ["<|calls|>", "<|call|>", "<|args|>", "<|end_call|>", "<|end_calls|>", "<think>", "</think>"]
EOS = 256
IDS = {marker: 257 + index for index, marker in enumerate(SPECIAL)}
KIMI_LIKE = CallSyntax(block_open="<|calls|>", call_open="<|call|>functions.{name}:{index}<|args|>",
                       call_close="<|end_call|>", block_close="<|end_calls|>")
TEXT_MARKED = CallSyntax(call_open='<call name="{name}">', call_close="</call>", separator="\n")
WEATHER = Tool("get_weather", None, {"type": "object", "properties": {"city": {"type": "string"}},
                                     "required": ["city"]})
CLOCK = Tool("now")


def _tokenizer():
    pieces = [bytes([byte]) for byte in range(256)] + [b"\xff</s>"] + [b"\xff" + marker.encode() for marker in SPECIAL]
    return tokenizer_from_pieces(pieces, [EOS], [EOS, *IDS.values()], list)


TOKENIZER = _tokenizer()


def tokens(text: str, special: dict[str, int]) -> list[int]:
    """`text` as tokens: each control-token marker its token, every other byte its own."""
    out, position = [], 0
    while position < len(text):
        marker = next((marker for marker in special if text.startswith(marker, position)), None)
        if marker is not None:
            out.append(special[marker])
            position += len(marker)
        else:
            out.extend(text[position].encode())
            position += 1
    return out


def accepts(output: list[int], syntax: CallSyntax, mode: str = "auto", special: dict[str, int] | None = None,
            reasoning: tuple[str, str] | None = None, reasoning_open: bool = False, parallel: bool = True) -> bool:
    special = IDS if special is None else special
    grammar = family_grammar([WEATHER, CLOCK], ToolChoice(ChoiceMode(mode)), parallel, syntax, special,
                             reasoning, reasoning_open)
    matcher = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return all(matcher.consume_token(token) for token in output) and matcher.is_accepting()


CALL = '<|calls|><|call|>functions.get_weather:0<|args|>{"city": "Paris"}<|end_call|><|end_calls|>'
TWO_CALLS = ('<|calls|><|call|>functions.get_weather:0<|args|>{"city": "Paris"}<|end_call|>'
             '<|call|>functions.now:1<|args|>{}<|end_call|><|end_calls|>')


def test_a_required_call_is_written_with_its_control_tokens():
    assert accepts(tokens(CALL, IDS), KIMI_LIKE, "required")
    assert accepts(tokens(TWO_CALLS, IDS), KIMI_LIKE, "required")
    # The markers written as text are not the markers: refused.
    assert not accepts(tokens(CALL, {}), KIMI_LIKE, "required")
    assert not accepts(tokens("Sure.", IDS), KIMI_LIKE, "required")


def test_arguments_follow_the_schema():
    assert not accepts(tokens(CALL.replace('"city"', '"town"'), IDS), KIMI_LIKE, "required")
    assert not accepts(tokens(CALL.replace("get_weather", "get_time"), IDS), KIMI_LIKE, "required")


def test_one_call_only_without_parallel_calls():
    assert accepts(tokens(CALL, IDS), KIMI_LIKE, "required", parallel=False)
    assert not accepts(tokens(TWO_CALLS, IDS), KIMI_LIKE, "required", parallel=False)


def test_auto_leaves_text_free_until_the_trigger():
    assert accepts(tokens("It is sunny, I think.", IDS), KIMI_LIKE, "auto")
    assert accepts(tokens("Let me check. " + CALL, IDS), KIMI_LIKE, "auto")
    assert not accepts(tokens("Let me check. " + CALL.replace('"city"', '"town"'), IDS), KIMI_LIKE, "auto")


def test_text_markers_and_no_block():
    call = '<call name="get_weather">{"city": "Paris"}</call>'
    assert accepts(tokens(call, {}), TEXT_MARKED, "required", special={})
    assert accepts(tokens(call + "\n" + '<call name="now">{}</call>', {}), TEXT_MARKED, "required", special={})
    assert accepts(tokens("Checking. " + call, {}), TEXT_MARKED, "auto", special={})
    assert accepts(tokens("No call here.", {}), TEXT_MARKED, "auto", special={})
    assert not accepts(tokens('Checking. <call name="get_weather">{"town": 1}</call>', {}), TEXT_MARKED, "auto",
                       special={})


@pytest.mark.parametrize("special", [IDS, {}], ids=["control-tokens", "text"])
def test_reasoning_may_come_first(special):
    syntax = KIMI_LIKE if special else TEXT_MARKED
    call = CALL if special else '<call name="now">{}</call>'
    assert accepts(tokens("<think>The user wants it.</think>\n" + call, special), syntax, "required", special,
                   reasoning=("<think>", "</think>"))
    # The prompt opened the block: the output starts inside it and must close it first.
    assert accepts(tokens("The user wants it.</think>" + call, special), syntax, "required", special,
                   reasoning=("<think>", "</think>"), reasoning_open=True)
    assert not accepts(tokens(call, special), syntax, "required", special, reasoning=("<think>", "</think>"),
                       reasoning_open=True)


XML_LIKE = CallSyntax(call_open="<tool_call>\n<function={name}>\n", call_close="</function>\n</tool_call>",
                      separator="\n", parameter_open="<parameter={key}>\n", parameter_close="\n</parameter>\n")
ALARM = Tool("set_alarm", None, {"type": "object", "properties": {
    "label": {"type": "string"}, "hour": {"type": "integer"}, "days": {"type": "array", "items": {"type": "string"}}},
    "required": ["hour"]})


def accepts_xml(text: str, mode: str = "required", tools=(ALARM, CLOCK)) -> bool:
    grammar = family_grammar(list(tools), ToolChoice(ChoiceMode(mode)), True, XML_LIKE, {})
    matcher = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return all(matcher.consume_token(token) for token in text.encode()) and matcher.is_accepting()


def test_parameters_one_block_each_strings_raw_the_rest_json():
    call = ("<tool_call>\n<function=set_alarm>\n<parameter=label>\nWake <up> now\n</parameter>\n"
            "<parameter=hour>\n7\n</parameter>\n</function>\n</tool_call>")
    assert accepts_xml(call)
    assert accepts_xml("<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n"
                       '<parameter=days>\n["mon", "tue"]\n</parameter>\n</function>\n</tool_call>')
    assert accepts_xml("<tool_call>\n<function=now>\n</function>\n</tool_call>")
    assert accepts_xml("Setting it. " + call, "auto")
    # The required parameter missing, a value of the wrong type, an unknown parameter: refused.
    assert not accepts_xml("<tool_call>\n<function=set_alarm>\n<parameter=label>\nx\n</parameter>\n"
                           "</function>\n</tool_call>")
    assert not accepts_xml("<tool_call>\n<function=set_alarm>\n<parameter=hour>\nseven\n</parameter>\n"
                           "</function>\n</tool_call>")
    assert not accepts_xml("<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n"
                           "<parameter=minute>\n5\n</parameter>\n</function>\n</tool_call>")
