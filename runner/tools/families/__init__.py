"""The registry of model families' tool-call and reasoning formats: one module, one family.

Every module of this package defines `FAMILY`, a `multiseq.tools.family.Family`; adding a
family is adding a module (docs/tool-formats.md says how). `detect` finds a chat template's
family: exact fingerprints first (most specific first); then, for a template that renders tool
calls but holds no known fingerprint, the family whose reader reads back a known call the
template was made to render (`derive`); then the generic format.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ..family import Family

GENERIC = "generic"


@cache
def all_families() -> tuple[Family, ...]:
    """Every registered family, in detection order."""
    families = [importlib.import_module(f"{__name__}.{module.name}").FAMILY
                for module in pkgutil.iter_modules(__path__) if not module.name.startswith("_")]
    names = [family.name for family in families]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        raise RuntimeError(f"tool-call families registered twice: {sorted(duplicates)}")
    return tuple(sorted(families, key=lambda family: (family.priority, family.name)))


def family_names() -> tuple[str, ...]:
    return tuple(sorted(family.name for family in all_families()))


def family_named(name: str) -> Family:
    """The family of that name (--tool-format); ValueError naming the known ones."""
    for family in all_families():
        if family.name == name:
            return family
    raise ValueError(f"unknown tool-call format {name!r}: the formats are {', '.join(family_names())}")


def detect(template: str | None) -> Family:
    """The family whose fingerprint the template holds, else the one derived from what it
    renders; the generic format when neither finds one."""
    if template:
        for family in all_families():
            if family.matches(template):
                return family
        derived = derive(template)
        if derived is not None:
            return derived
    return family_named(GENERIC)


# A known call, rendered by the template as an assistant's turn of the history: whoever reads it
# back is the family the template writes calls in.
_PROBE_NAME, _PROBE_ARGUMENTS = "probe_weather", {"probe_city": "Probeville"}
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_NAME, "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"probe_city": {"type": "string"}}, "required": ["probe_city"]}}}]
_PROBE_QUESTION = [{"role": "user", "content": "What is the weather in Probeville?"}]
_PROBE_TURN = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_probe0001", "type": "function", "function": {"name": _PROBE_NAME, "arguments": _PROBE_ARGUMENTS}}]}


def derive(template: str) -> Family | None:
    """The family whose reader reads the template's own rendering of a known call back as that
    call (llama.cpp's autoparser reads a template's markers the same way); None when the
    template renders no call, cannot be rendered, or no family reads it."""
    if "tool" not in template:
        return None
    turn = _rendered_call_turn(template)
    if turn is None or _PROBE_NAME not in turn:
        return None
    from ..family import ParseContext  # noqa: PLC0415 - the registry loads before the readers need it
    from ..types import Tool
    tools = {_PROBE_NAME: Tool(_PROBE_NAME, None, _PROBE_TOOLS[0]["function"]["parameters"])}
    for family in all_families():
        if family.name == GENERIC:
            continue
        try:
            calls = [segment for segment in family.parse(turn, ParseContext(final=True, tools=tools)).segments
                     if hasattr(segment, "arguments")]
        except Exception:  # noqa: BLE001 - a reader that chokes on another family's text is not it
            continue
        if [(call.name, _json_or_none(call.arguments)) for call in calls] == [(_PROBE_NAME, _PROBE_ARGUMENTS)]:
            return family
    return None


def _rendered_call_turn(template: str) -> str | None:
    """What the template writes for an assistant's call: its rendering of the conversation
    with the call, less its rendering of the conversation up to the assistant's turn."""
    from ...llama.chat_template import JinjaRenderer

    try:
        renderer = JinjaRenderer(template, "the chat template", "", "", add_bos=False)
        prompt = renderer.render(tuple(_PROBE_QUESTION), _PROBE_TOOLS)
        whole = renderer.render((*_PROBE_QUESTION, _PROBE_TURN), _PROBE_TOOLS)
    except Exception:  # noqa: BLE001 - a template that cannot render this conversation says nothing
        return None
    shared = 0
    while shared < min(len(prompt), len(whole)) and prompt[shared] == whole[shared]:
        shared += 1
    return whole[shared:]


def _json_or_none(text: str):
    import json

    try:
        return json.loads(text)
    except ValueError:
        return None
