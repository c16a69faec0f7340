"""Every family's call syntax against its own reader: a call written as the family's grammar
lets a model write it is accepted by that grammar, and read back by the family's parser as the
same call, for every family and sub-format that constrains calls (a new family's grammar and
parser cannot drift apart unnoticed).

Byte-level tokens stand in for a model's (markers written as text), as in
test_family_grammars_unit.py.
"""

from __future__ import annotations

import json

import llguidance
import pytest

from multiseq.tools import ChoiceMode, Tool, ToolChoice, read_output
from multiseq.tools.families import all_families
from multiseq.tools.grammars import family_grammar
from multiseq.tools.writing import written
from test_family_grammars_unit import TOKENIZER

WEATHER = Tool("get_weather", None, {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "object"}}, "required": ["city"]})
CLOCK = Tool("now")
CALLS = [("get_weather", {"city": "Paris <b> & \"Nice\"", "days": 3, "units": {"temp": "c"}}), ("now", {})]

CASES = [(family, variant) for family in all_families() if family.legacy_format is None
         for variant in (None, *family.variant_call_syntax) if family.syntax_for(variant) is not None]


@pytest.mark.parametrize("family, variant", CASES, ids=[f"{family.name}-{variant}" for family, variant in CASES])
def test_a_constrained_call_reads_back_as_itself(family, variant):
    syntax = family.syntax_for(variant)
    calls = CALLS[:1] if syntax.call_close in ("<|call|>",) else CALLS  # gpt-oss: one call per turn
    text = written(syntax, calls)
    grammar = family_grammar([WEATHER, CLOCK], ToolChoice(ChoiceMode.REQUIRED), True, syntax, {})
    matcher = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    assert all(matcher.consume_token(byte) for byte in text.encode()), f"the grammar refuses {text!r}"
    assert matcher.is_accepting()
    parsed = read_output(text, family, tools=[WEATHER, CLOCK], variant=variant)
    assert [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls] == calls, text
    assert parsed.content is None and parsed.error is None
