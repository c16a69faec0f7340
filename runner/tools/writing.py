"""Calls written as a family's call syntax writes them (CallSyntax, multiseq.tools.family): the
text a constrained call comes out as, for the tests that read it back and for the benchmarks
that time reading it. Strings are raw in parameter blocks and the rest JSON; every value is
JSON, or in the syntax's object notation, where the syntax says so."""

from __future__ import annotations

import json

from .family import CallSyntax


def written(syntax: CallSyntax, calls: list[tuple[str, dict]]) -> str:
    """The calls as the syntax writes them (strings raw in parameter blocks, the rest JSON; every
    value JSON, or in the syntax's object notation, where it says so), after the content's
    closer where forced calls follow content."""
    parts = []
    for index, (name, arguments) in enumerate(calls):
        opening = syntax.call_open.replace("{name}", escaped(syntax, name)).replace("{index}", str(index))
        if syntax.parameter_open is None:
            body = json.dumps(arguments, ensure_ascii=False)
        else:
            items = sorted(arguments.items(), key=lambda item: item[0].lower()) if syntax.sorts_keys else arguments.items()
            body = syntax.parameter_separator.join(parameter(syntax, key, value) for key, value in items)
        parts.append(opening + body + syntax.call_close)
    return syntax.content_close + syntax.block_open + syntax.separator.join(parts) + syntax.block_close


def parameter(syntax: CallSyntax, key: str, value) -> str:
    if syntax.string_quote:
        key, text = notation(syntax, key, key=True), notation(syntax, value)
    elif syntax.values_as_json or not isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = value
    opening = (syntax.parameter_open.replace("{key}", escaped(syntax, key))
               .replace("{string}", str(isinstance(value, str)).lower()).replace("{type}", xtml_type(value)))
    return opening + text + syntax.parameter_close.replace("{key}", key)


def escaped(syntax: CallSyntax, text: str) -> str:
    for old, new in syntax.attribute_escapes:
        text = text.replace(old, new)
    return text


def xtml_type(value) -> str:
    """A value's type as Kimi K3's template names it (an integer is a number)."""
    kinds = ((bool, "boolean"), (type(None), "null"), ((int, float), "number"), (str, "string"), (dict, "object"))
    return next((kind for python_type, kind in kinds if isinstance(value, python_type)), "array")


def notation(syntax: CallSyntax, value, key: bool = False) -> str:
    """A value in Gemma 4's notation: strings between the quote, keys bare where they can be."""
    quote = syntax.string_quote
    if key:
        bare = value and value == value.strip() and not any(character in value for character in ":{}[],<")
        return value if bare else quote + value + quote
    if isinstance(value, str):
        return quote + value + quote
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: item[0].lower()) if syntax.sorts_keys else value.items()
        return "{" + ",".join(notation(syntax, k, key=True) + ":" + notation(syntax, v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(notation(syntax, item) for item in value) + "]"
    return json.dumps(value)
