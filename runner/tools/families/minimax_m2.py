"""MiniMax M2 (M2.1, M2.5): one <minimax:tool_call> block holding one <invoke> per call,
parameters as <parameter name="KEY">VALUE</parameter>, reasoning in <think>...</think>:

    The user wants the weather.
    </think>

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

The template's generation prompt opens the reasoning ("]~b]ai\\n<think>\\n"). Values are plain
text typed by the tool's schema (non-strings are written as JSON); a newline on either side of
a value is dropped, as MiniMax's own parser does. Each <invoke> is a call as soon as it closes.
MiniMax-M1 writes JSON in <tool_calls> and MiniMax-M3 namespaced tags (]<]minimax[>[): not this.
"""

from ..family import CallSyntax, Family, FamilyParse, ParseContext
from ._xml_calls import XmlCallSyntax, parse_xml_calls

SYNTAX = XmlCallSyntax(
    block_open="<minimax:tool_call>", block_close="</minimax:tool_call>",
    function_open="<invoke name=", function_close="</invoke>",
    parameter_open="<parameter name=", parameter_close="</parameter>",
    reasoning=("<think>", "</think>"),
    end_tokens=("[e~[", "]~b]", "]~!b["),
    newline_around_values=True,
)


def parse(text: str, context: ParseContext) -> FamilyParse:
    return parse_xml_calls(SYNTAX, text, context)


FAMILY = Family(
    name="minimax-m2",
    description='<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n'
                "</invoke>\\n</minimax:tool_call> (MiniMax M2, M2.1, M2.5)",
    parse=parse,
    fingerprints=(("<minimax:tool_call>",),),
    markers=SYNTAX.markers,
    reasoning=SYNTAX.reasoning,
    priority=30,
    # Constrained calls, as the template writes them back into the history.
    call_syntax=CallSyntax(block_open="<minimax:tool_call>\n", call_open='<invoke name="{name}">\n',
                           call_close="</invoke>\n", block_close="</minimax:tool_call>",
                           parameter_open='<parameter name="{key}">', parameter_close="</parameter>\n"),
)
