"""ByteDance Seed-OSS: the Qwen3-Coder tags in a <seed:tool_call> block, values written as they
are (no newline of markup around them), reasoning in <seed:think>...</seed:think>:

    <seed:think>The user wants the weather.</seed:think>
    <seed:tool_call>
    <function=get_weather>
    <parameter=city>Paris</parameter>
    </function>
    </seed:tool_call>

The model opens its reasoning itself (the prompt ends with "<seed:bos>assistant\\n"); with a
thinking budget it writes <seed:cot_budget_reflect>...</seed:cot_budget_reflect> inside the
reasoning (the tags are dropped, their text stays reasoning). The template renders non-string
arguments with Python's str (`True`, `{'a': 1}`), which the values' reading accepts.
"""

from ..family import CallSyntax, Family, FamilyParse, ParseContext
from ._xml_calls import XmlCallSyntax, parse_xml_calls

SYNTAX = XmlCallSyntax(
    block_open="<seed:tool_call>", block_close="</seed:tool_call>",
    function_open="<function=", function_close="</function>",
    parameter_open="<parameter=", parameter_close="</parameter>",
    reasoning=("<seed:think>", "</seed:think>"),
    reasoning_tags=("<seed:cot_budget_reflect>", "</seed:cot_budget_reflect>"),
    end_tokens=("<seed:eos>", "<seed:bos>", "<seed:pad>"),
    newline_around_values=False,
)


def parse(text: str, context: ParseContext) -> FamilyParse:
    return parse_xml_calls(SYNTAX, text, context)


FAMILY = Family(
    name="seed-oss",
    description="<seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n</function>\\n"
                "</seed:tool_call> (ByteDance Seed-OSS)",
    parse=parse,
    fingerprints=(("<seed:tool_call>",),),
    markers=SYNTAX.markers,
    reasoning=SYNTAX.reasoning,
    priority=25,  # its template also writes <function= and <parameter= (qwen3-xml's tags)
    # Constrained calls, as the template writes them back into the history.
    call_syntax=CallSyntax(call_open="<seed:tool_call>\n<function={name}>\n",
                           call_close="</function>\n</seed:tool_call>", separator="\n",
                           parameter_open="<parameter={key}>", parameter_close="</parameter>\n"),
)
