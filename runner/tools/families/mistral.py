"""Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}] (v3: Mistral 7B v0.3, Nemo) and
[TOOL_CALLS]name[ARGS]{...} (v11 and later: Mistral Small 3.2, Devstral, Magistral, Ministral 3),
with [CALL_ID]id before [ARGS] where the model writes its call's id (Mistral Small 3.2):

    Checking.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Reasoning (Magistral, Ministral 3 Reasoning) in [THINK]...[/THINK] at the start of the output,
control tokens; Magistral Small 2506 wrote <think>...</think> as text.
"""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="mistral",
    description='[TOOL_CALLS][{"name": ..., "arguments": {...}}] or [TOOL_CALLS]name[ARGS]{...} (Mistral, Devstral)',
    parse=legacy_parse("mistral"),
    fingerprints=(("[TOOL_CALLS]",),),
    markers=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"),
    reasoning=("[THINK]", "[/THINK]"),
    priority=85,
    legacy_format="mistral",
    call_id_length=9,  # Mistral's templates refuse any other id ("alphanumeric strings with length 9")
)
