"""Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}] (Nemo, Small 3.x) and
[TOOL_CALLS]name[ARGS]{...} (v11 templates: Devstral, Magistral, Ministral 3)."""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="mistral",
    description='[TOOL_CALLS][{"name": ..., "arguments": {...}}] or [TOOL_CALLS]name[ARGS]{...} (Mistral, Devstral)',
    parse=legacy_parse("mistral"),
    fingerprints=(("[TOOL_CALLS]",),),
    markers=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"),
    priority=85,
    legacy_format="mistral",
)
