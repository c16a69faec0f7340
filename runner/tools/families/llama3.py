"""Llama 3.1-3.3: a JSON object {"name": ..., "parameters": {...}}, or <|python_tag|> before it."""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="llama3",
    description='{"name": ..., "parameters": {...}} or <|python_tag|>{...} (Llama 3.1, 3.2, 3.3)',
    parse=legacy_parse("llama3"),
    fingerprints=(("<|python_tag|>",), ("ipython", "<|start_header_id|>")),
    markers=("<|python_tag|>", "<|eom_id|>", "<|eot_id|>"),
    priority=85,
    legacy_format="llama3",
)
