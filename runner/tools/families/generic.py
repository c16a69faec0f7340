"""Templates that know no tools: the tools described in a system part, and the answer written as
{"tool_calls": [{"name": ..., "arguments": {...}}]} or {"response": "..."} (llama.cpp's Generic)."""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="generic",
    description='{"tool_calls": [{"name": ..., "arguments": {...}}]} for templates that know no tools',
    parse=legacy_parse("generic"),
    priority=1000,  # never detected by a fingerprint: what is left
    legacy_format="generic",
)
