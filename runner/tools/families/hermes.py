"""Hermes 2 Pro and Qwen 2.5 / Qwen3 (non-Coder): <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
reasoning in <think>...</think> (Qwen3)."""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="hermes",
    description='<tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes 2 Pro, Qwen 2.5, Qwen3)',
    parse=legacy_parse("hermes"),
    fingerprints=(("<tool_call>", "arguments"), ("<tool_call>",)),
    markers=("<tool_call>", "</tool_call>", "<think>", "</think>"),
    reasoning=("<think>", "</think>"),
    priority=80,  # after the families whose templates also write <tool_call> (Qwen3-Coder's XML, GLM)
    legacy_format="hermes",
)
