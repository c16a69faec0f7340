"""Calls constrained in a family's own syntax (runner/tools/grammars.py's family_grammar): the
markers that are control tokens are required as those tokens, JSON arguments follow the
tool's schema, `auto` leaves text free until the trigger, reasoning may come first.

A byte vocabulary with a few control tokens stands in for a model's: a grammar is checked by
feeding an output token by token to an llguidance matcher.
"""

from __future__ import annotations

import llguidance
import pytest

from multiseq.sampling.grammar import tokenizer_from_pieces
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


def marker_tokenizer(markers) -> tuple:
    """A byte vocabulary whose control tokens are `markers` (a model family's), and their ids."""
    ids = {marker: 257 + index for index, marker in enumerate(markers)}
    pieces = [bytes([byte]) for byte in range(256)] + [b"\xff</s>"] + [b"\xff" + marker.encode() for marker in markers]
    return tokenizer_from_pieces(pieces, [EOS], [EOS, *ids.values()], list), ids


REQUIRED = ToolChoice(ChoiceMode.REQUIRED)


def family_accepts(text: str, family, tools, choice: ToolChoice = REQUIRED, control=(),
                   variant: str | None = None, prompt: str = "", parallel: bool = True) -> bool | None:
    """Whether a family's grammar for a request, built as the server builds it (the family's
    reasoning, open where the prompt opened it; `control`: its markers that are control tokens),
    accepts `text`; None where there is no grammar."""
    tokenizer, ids = marker_tokenizer(control)
    grammar = family_grammar(list(tools), choice, parallel, family.syntax_for(variant), ids, family.reasoning,
                             family.opens_reasoning(prompt))
    if grammar is None:
        return None
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return all(matcher.consume_token(token) for token in tokens(text, ids)) and matcher.is_accepting()


PY_LIKE = CallSyntax(block_open="<|calls|>[", block_close="]<|end_calls|>", call_open="{name}(", call_close=")",
                     separator=", ", parameter_open="{key}=", parameter_separator=", ", values_as_json=True)
SEARCH = Tool("search", None, {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}})


def accepts_syntax(text: str, syntax: CallSyntax, tools=(ALARM, SEARCH, CLOCK), mode: str = "required",
                   special: dict[str, int] | None = None) -> bool:
    grammar = family_grammar(list(tools), ToolChoice(ChoiceMode(mode)), True, syntax, IDS if special is None else special)
    matcher = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return all(matcher.consume_token(token) for token in tokens(text, IDS if special is None else special)) \
        and matcher.is_accepting()


@pytest.mark.parametrize("calls, accepted", [
    ("set_alarm(hour=7)", True), ('set_alarm(label="x", hour=7)', True), ('set_alarm(hour=7, days=["mon"])', True),
    ('set_alarm(label="a \\"b\\"\\n", hour=7, days=[])', True), ("search()", True), ("search(limit=3)", True),
    ('search(query="a", limit=3)', True), ('now(), search(query="a")', True),
    # A separator before the first parameter written, none between two, one after the last; the
    # required one missing, the schema's order not kept, a string not JSON: refused.
    ("set_alarm(, hour=7)", False), ('set_alarm(label="x" hour=7)', False), ("set_alarm(hour=7, )", False),
    ('set_alarm(label="x")', False), ("search(, limit=3)", False), ('search(limit=3, query="a")', False),
    ("set_alarm(label='x', hour=7)", False), ("now(), ", False),
])
def test_a_separator_between_the_parameters_written_whichever_optional_ones_are_left_out(calls, accepted):
    assert accepts_syntax("<|calls|>[" + calls + "]<|end_calls|>", PY_LIKE) is accepted


TYPED = CallSyntax(call_open='<call name="{name}">', call_close="</call>", parameter_open='<arg key="{key}" type="{type}">',
                   parameter_close="<|end_call|>", attribute_escapes=(("&", "&amp;"), ('"', "&quot;")))
ANY_OF = Tool("note", None, {"type": "object", "properties": {
    "text": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "n": {"type": ["integer", "number"], "minimum": 0},
    "level": {"enum": ["low", 2]}, "extra": {}, 'a "quoted" & key': {"type": "boolean"}}})


@pytest.mark.parametrize("arguments, accepted", [
    ('<arg key="text" type="string">any <b>text</b> "quoted"<|end_call|>', True),
    ('<arg key="text" type="null">null<|end_call|>', True),
    ('<arg key="n" type="number">3<|end_call|>', True), ('<arg key="n" type="number">2.5<|end_call|>', True),
    ('<arg key="level" type="string">low<|end_call|>', True), ('<arg key="level" type="number">2<|end_call|>', True),
    ('<arg key="extra" type="object">{"a": [1]}<|end_call|>', True), ('<arg key="extra" type="string">x<|end_call|>', True),
    ('<arg key="a &quot;quoted&quot; &amp; key" type="boolean">true<|end_call|>', True),
    # A type its schema does not allow, a value not of the type named, a number below the minimum.
    ('<arg key="text" type="number">3<|end_call|>', False), ('<arg key="n" type="string">3<|end_call|>', False),
    ('<arg key="n" type="number">-1<|end_call|>', False), ('<arg key="level" type="number">3<|end_call|>', False),
    ('<arg key="text" type="null">nul<|end_call|>', False),
    ('<arg key="a "quoted" & key" type="boolean">true<|end_call|>', False),
])
def test_a_type_placeholder_gives_one_alternative_per_type_the_schema_allows(arguments, accepted):
    assert accepts_syntax('<call name="note">' + arguments + "</call>", TYPED, tools=(ANY_OF,)) is accepted


def test_several_functions_whose_string_values_end_at_a_control_token():
    # Their value lexeme is defined once (a grammar defining it twice does not compile).
    two = [Tool(name, None, {"type": "object", "properties": {"text": {"type": "string"}}}) for name in ("a", "b")]
    assert accepts_syntax('<call name="b"><arg key="text" type="string">x<|end_call|></call>', TYPED, tools=two)


CONTENT_FIRST = CallSyntax(content_close="<|end_call|>", block_open="<|calls|>", block_close="<|end_calls|>",
                           call_open="<|call|>{name}<|args|>", call_close="<|end_call|>", constrains_auto=False)


@pytest.mark.parametrize("special", [IDS, {}], ids=["control-tokens", "text"])
def test_content_may_come_before_forced_calls_up_to_its_closer(special):
    call = "<|calls|><|call|>now<|args|>{}<|end_call|><|end_calls|>"
    for before in ("", "On it.", "Two\nlines <b>"):
        assert accepts_syntax(before + "<|end_call|>" + call, CONTENT_FIRST, special=special)
    assert not accepts_syntax(call, CONTENT_FIRST, special=special)  # the content's closer first
    assert family_grammar([CLOCK], ToolChoice(ChoiceMode.AUTO), True, CONTENT_FIRST, special) is None


def test_a_name_or_key_the_syntax_cannot_write_gives_its_fallback_or_no_grammar():
    fallback = CallSyntax(block_open="<|calls|>", block_close="<|end_calls|>", call_open='{"name": "{name}", "arguments": ',
                          call_close="}")
    strict = CallSyntax(**{**PY_LIKE.__dict__, "name_pattern": "[a-z_]+", "key_pattern": "[a-z]+"})
    dashed = Tool("set-alarm", None, ALARM.schema)
    assert accepts_syntax("<|calls|>[set_alarm(hour=7)]<|end_calls|>", strict, tools=(ALARM,))
    assert family_grammar([dashed], ToolChoice(ChoiceMode.REQUIRED), True, strict, IDS) is None
    with_fallback = CallSyntax(**{**strict.__dict__, "fallback": fallback})
    assert accepts_syntax('<|calls|>{"name": "set-alarm", "arguments": {"hour": 7}}<|end_calls|>', with_fallback,
                          tools=(dashed, CLOCK))
    assert not accepts_syntax("<|calls|>[set_alarm(hour=7)]<|end_calls|>", with_fallback, tools=(dashed, ALARM))
