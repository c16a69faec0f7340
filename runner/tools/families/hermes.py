"""Hermes 2 Pro and Qwen 2.5 / Qwen3 (non-Coder): <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
reasoning in <think>...</think> (Qwen3)."""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="hermes",
    description='<tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes 2 Pro, Qwen 2.5, Qwen3)',
    parse=legacy_parse("hermes"),
    # The JSON call's own key, quoted as the template writes it: a template that holds
    # <tool_call> but writes another body (XML, say) is left to the other fingerprints or to
    # what it renders.
    fingerprints=(("<tool_call>", '"arguments"'),),
    markers=("<tool_call>", "</tool_call>", "<think>", "</think>"),
    reasoning=("<think>", "</think>"),
    priority=80,  # after the families whose templates also write <tool_call> (Qwen3-Coder's XML, GLM)
    legacy_format="hermes",
)
