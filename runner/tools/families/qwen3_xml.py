"""Qwen3-Coder, Qwen3-Coder-Next, Qwen3.5 and later, NVIDIA Nemotron 3 Nano and StepFun 3.5:
XML-like calls, one function per <tool_call> block, each parameter's value on its own lines:

    The user wants the weather.
    </think>

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Reasoning is in <think>...</think>; the Qwen3.5+ and Nemotron templates open it in the prompt
(`<think>\\n`), and a call may end it without </think>. Values are plain text: exactly one newline on
each side is markup, and the tool's schema types them (`7` is 7 for an integer, "7" for a string;
the Qwen3-Coder-30B template writes Python's `True`). Qwen3-Coder sometimes leaves out the
opening <tool_call> before the first call (the `<function=` then starts a line).
"""

from ..family import CallSyntax, Family, FamilyParse, ParseContext
from ._xml_calls import XmlCallSyntax, parse_xml_calls

SYNTAX = XmlCallSyntax(
    block_open="<tool_call>", block_close="</tool_call>",
    function_open="<function=", function_close="</function>",
    parameter_open="<parameter=", parameter_close="</parameter>",
    reasoning=("<think>", "</think>"),
    end_tokens=("<|im_end|>", "<|im_start|>", "<|endoftext|>"),
    newline_around_values=True,
    bare_function=True,
)


def parse(text: str, context: ParseContext) -> FamilyParse:
    return parse_xml_calls(SYNTAX, text, context)


FAMILY = Family(
    name="qwen3-xml",
    description="<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call> "
                "(Qwen3-Coder, Qwen3.5+, Nemotron 3 Nano, StepFun 3.5)",
    parse=parse,
    # The templates write both tags; Seed-OSS's <seed:tool_call> holds no "<tool_call>".
    fingerprints=(("<tool_call>", "<function=", "<parameter="),),
    markers=SYNTAX.markers,
    reasoning=SYNTAX.reasoning,
    priority=30,  # before hermes, whose fingerprint ("<tool_call>") these templates also hold
    # Constrained calls, as the templates write them back into the history.
    call_syntax=CallSyntax(call_open="<tool_call>\n<function={name}>\n", call_close="</function>\n</tool_call>",
                           separator="\n", parameter_open="<parameter={key}>\n", parameter_close="\n</parameter>\n"),
)
