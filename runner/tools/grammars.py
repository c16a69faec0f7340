"""The grammar that makes every tool call valid: llguidance Lark over the request's tools, in
the call syntax of the model's family (multiseq.tools.family's CallSyntax).

One grammar per (syntax, tools, choice, parallel): `required` and a named function constrain
the output from its first token to calls whose arguments follow each tool's `parameters`;
`auto` leaves the model free until it writes the syntax's trigger (`<tool_call>`,
`[TOOL_CALLS]`, a leading `{` where calls lead the output), then constrains the calls
(llguidance's lazy lexemes: free text ends at the trigger, and from there the calls are
forced); `none` has no grammar. A call's JSON is written with fixed separators (", " and ": "),
exactly as `json.dumps` writes it, so that a call re-rendered into the next turn's prompt
matches the tokens the model generated.

Grammars are text, built in microseconds; llguidance compiles each distinct one once (the
constraint cache in multiseq.sampling.grammar keys on the text), so an agent that sends the same tools
every turn pays for the compile once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..sampling.schema import grammar_schema, json_options
from .family import CallSyntax
from .types import ChoiceMode, Tool, ToolChoice

# A call's arguments are JSON with no free whitespace and json.dumps' separators (see the module
# docstring); lenient: keywords llguidance cannot enforce are left to validating the arguments.
CALL_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Any text; free text in `auto` is this minus the format's trigger.
_ANY_TEXT = "/(?s:.*)/"


def _lark_string(text: str) -> str:
    """A Lark string literal of `text` (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def arguments_json(tool: Tool) -> str:
    """A tool's arguments as an llguidance %json: its own document (so its $defs and $refs
    resolve within it), narrowed as every grammar's schema is (declared properties only where it
    leaves others unsaid, numbers of bounded length: multiseq.sampling.schema.grammar_schema) so calls end."""
    schema = grammar_schema(tool.schema)
    return "%json " + json.dumps({**schema, "x-guidance": _call_json_options(schema, tool.strict)}, ensure_ascii=False)


def _call_json_options(schema: Mapping, strict: bool) -> dict:
    """The JSON options of a call's value: the schema's, with CALL_JSON_OPTIONS' separators and
    no free whitespace (a whitespace_pattern would allow some after all)."""
    options = {**json_options(dict(schema), strict=strict), **CALL_JSON_OPTIONS}
    return {key: value for key, value in options.items() if key != "whitespace_pattern"}


def _offered(tools: Sequence[Tool], choice: ToolChoice) -> list[Tool]:
    if choice.mode is ChoiceMode.FUNCTION:
        named = [tool for tool in tools if tool.name == choice.name]
        if not named:
            raise ValueError(f"tool_choice names the function {choice.name!r}, which is not among the tools")
        return named
    return list(tools)


def _free_text_without(trigger_regex: str) -> str:
    """Free text that never holds the trigger (so writing it always starts a call)."""
    return f"TEXT: {_ANY_TEXT} & ~/(?s:.*){trigger_regex}(?s:.*)/\n"


class _Unwritable(ValueError):
    """A function's name or a parameter's key that the syntax cannot write."""


def family_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool, syntax: CallSyntax,
                   special_tokens: Mapping[str, int], reasoning: tuple[str, str] | None = None,
                   reasoning_open: bool = False) -> str | None:
    """The Lark grammar of calls written in a family's syntax. `special_tokens`: the markers
    that are control tokens of the vocabulary (by text), required as those tokens (llguidance's
    <[id]>); `reasoning`: the family's reasoning markers, a block the model may write first (or,
    with `reasoning_open`, is already inside: the prompt opened it). Where the syntax cannot write a
    function's name or key: its fallback syntax's grammar, or None (calls read as the model writes them)."""
    if choice.mode is ChoiceMode.NONE or not tools or (not choice.forces_call and not syntax.constrains_auto):
        return None
    offered = _offered(tools, choice)
    many = parallel and choice.mode is not ChoiceMode.FUNCTION

    def literal(text: str) -> str:
        return _marked_literal(text, special_tokens)

    # The trigger starts the calls in free text: the block's opening, or each call's opening up
    # to the function's name. A call is its trigger (where the block has none) and its tail.
    trigger = syntax.trigger or syntax.block_open or syntax.call_open.split("{", 1)[0]
    call_trigger = "" if syntax.block_open else trigger
    try:
        rules = _call_rules_of(offered, syntax, call_trigger, literal, special_tokens)
    except _Unwritable:
        fallback = syntax.fallback
        return fallback and family_grammar(tools, choice, parallel, fallback, special_tokens, reasoning, reasoning_open)
    more = " (" + " ".join(item for item in (literal(syntax.separator), "call") if item) + ")*" if many else ""
    ending = f" {literal(syntax.block_close)}" if syntax.block_close else ""
    content = ""
    if choice.forces_call:  # content first where the syntax's calls follow it (up to its closer)
        lead, content = _text_up_to("CONTENT", syntax.content_close, special_tokens)
        parts = (lead, literal(syntax.block_open), f"call{more}{ending}")
        body = "body: " + " ".join(part for part in parts if part) + "\n"
    elif syntax.leads:  # text that does not begin as the calls do, or the calls
        first = _regex_escape((syntax.block_open or syntax.call_open)[0])
        opening = literal(syntax.block_open) + " call" if syntax.block_open else "call"
        body = f"body: TEXT | {opening}{more}{ending}\nTEXT: /([^{first}](?s:.*))?/\n"
    elif any(trigger.startswith(marker) for marker in special_tokens):
        # Free text never holds a control token: writing the token starts the calls.
        opening = literal(syntax.block_open) + " call" if syntax.block_open else "call"
        body = f"body: TEXT | TEXT? {opening}{more}{ending}\nTEXT: {_ANY_TEXT}\n"
    else:
        # Free text ends lazily at the trigger (it never holds one), then the calls.
        rest = f"{literal(syntax.block_open[len(trigger):])} call".strip() if syntax.block_open else "tail"
        body = (f"body: TEXT | head {rest}{more}{ending}\n" f"head[lazy]: TEXT {literal(trigger)}\n"
                + _free_text_without(_regex_escape(trigger)))
    if reasoning is not None and syntax.reasoning is not None:
        reasoning = syntax.reasoning
    start, thought = _reasoning_rules(reasoning, reasoning_open, special_tokens, literal)
    index = "INDEX: /[0-9]+/\n" if "{index}" in syntax.call_open else ""
    return "%llguidance {}\n" + start + body + "\n".join(rules) + "\n" + thought + index + content


def _call_rules_of(offered: Sequence[Tool], syntax: CallSyntax, call_trigger: str, literal,
                   special_tokens: Mapping[str, int]) -> list[str]:
    """`call`: a trigger and one offered function's tail (`tail_N`), and the rules their arguments need (each once)."""
    rules = [" ".join(part for part in ("call:", literal(call_trigger), "tail") if part),
             f"tail: {' | '.join(f'tail_{index}' for index in range(len(offered)))}"]
    for index, tool in enumerate(offered):
        name = _written(tool.name, syntax.name_pattern, syntax)
        opening = syntax.call_open.replace("{name}", name)[len(call_trigger):]
        head, has_index, rest = opening.partition("{index}")
        items = [literal(head), "INDEX" if has_index else "", literal(rest), f"args_{index}", literal(syntax.call_close)]
        rules.append(f"tail_{index}: " + " ".join(item for item in items if item))
        if syntax.parameter_open is None:
            rules.append(f"args_{index}: {arguments_json(tool)}")
        else:
            rules += _parameter_rules(f"args_{index}", tool, syntax, literal, special_tokens)
    return list(dict.fromkeys(rules))  # a lexeme that several values share is defined once


def _written(text: str, pattern: str | None, syntax: CallSyntax) -> str:
    """A name or key as the syntax writes it, its attribute escapes made (_Unwritable: not as its pattern says)."""
    if pattern is not None and re.fullmatch(pattern, text) is None:
        raise _Unwritable(text)
    for old, new in syntax.attribute_escapes:
        text = text.replace(old, new)
    return text


def _text_up_to(name: str, closer: str, special_tokens: Mapping[str, int]) -> tuple[str, str]:
    """Text up to `closer` (which it never holds) and the closer: its items and lexeme (none without a closer)."""
    if not closer:
        return "", ""
    if any(closer.startswith(marker) for marker in special_tokens):  # a control token never occurs in text
        return f"{name}? {_marked_literal(closer, special_tokens)}", f"{name}: {_ANY_TEXT}\n"
    return name, f"{name}: ({_ANY_TEXT} & ~/(?s:.*){_regex_escape(closer)}(?s:.*)/) {_lark_string(closer)}\n"


def _parameter_rules(name: str, tool: Tool, syntax: CallSyntax, literal, special_tokens: Mapping[str, int]) -> list[str]:
    """A call's arguments as one block per parameter, in the schema's order (or their names'), the
    required ones present, the syntax's separator between two written: a string's value raw text up
    to the block's end (never holding it), any other value JSON; or every value JSON, or in a notation."""
    schema = grammar_schema(tool.schema)
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or ())
    if not properties:  # a function without parameters: nothing between its opening and close
        return [f'{name}: ""']
    values = _Values(name, schema, tool.strict, syntax, literal, special_tokens)
    keys = sorted(properties, key=str.lower) if syntax.sorts_keys else list(properties)
    items, rules = [], []
    for position, key in enumerate(keys):
        rule = f"{name}_{position}"
        written_key = values.notation.key(key) if values.notation else _written(key, syntax.key_pattern, syntax)
        closing = literal(syntax.parameter_close.replace("{key}", written_key))
        alternatives = []
        for kind, raw, value in values.of(f"{rule}_value", properties[key], closing):
            opening = syntax.parameter_open.replace("{key}", written_key).replace("{type}", kind)
            alternatives.append(f"{literal(opening.replace('{string}', 'true' if raw else 'false'))} {value}".strip())
        rules.append(f"{rule}: " + " | ".join(alternatives))
        items.append((rule, key in required))
    return rules + _sequence(name, items, literal(syntax.parameter_separator)) + values.rules


def _sequence(name: str, items: Sequence[tuple[str, bool]], separator: str) -> list[str]:
    """`name`: the items (rule, required) in order, each optional one present or not, the
    separator between two written: none before the first written, one before every later one."""
    if not separator:
        return [f"{name}: " + " ".join(rule if needed else f"{rule}?" for rule, needed in items)]
    # `{name}_from_K`: the items from K on, each after a separator; the first written: one up to the first required.
    after = [f" {name}_from_{position + 1}" if position + 1 < len(items) else "" for position in range(len(items))]
    rules = [f"{name}_from_{position}: " + (f"{separator} {rule}" if needed else f"({separator} {rule})?")
             + after[position] for position, (rule, needed) in enumerate(items) if position]
    required = [position for position, (_, needed) in enumerate(items) if needed]
    last = (required or [len(items) - 1])[0]
    firsts = " | ".join(items[position][0] + after[position] for position in range(last + 1))
    return [f"{name}: " + (firsts if required else f"({firsts})?")] + rules


class _Values:
    """The values of one function's parameters as its syntax writes them, and the rules they need."""

    def __init__(self, name: str, root: Mapping, strict: bool, syntax: CallSyntax, literal,
                 special_tokens: Mapping[str, int]) -> None:
        self.root, self.strict, self.syntax = root, strict, syntax
        self.closes_with_token = any(syntax.parameter_close.startswith(marker) for marker in special_tokens)
        self.notation = syntax.string_quote and _Notation(f"{name}_n", root, strict, syntax, literal, special_tokens)
        self.rules: list[str] = self.notation.rules if self.notation else []

    def of(self, rule: str, schema: Any, closing: str) -> list[tuple[str, bool, str]]:
        """A parameter's alternatives: (its value's type name, whether it is raw text, its value and closing)."""
        schema = schema if isinstance(schema, dict) else {}
        if self.notation:
            return [("", False, f"{self.notation.value(schema)} {closing}")]
        if "{type}" in (self.syntax.parameter_open or ""):  # one alternative per type, its name in the opening
            typed = _by_type(schema, self.root) or _ANY_TYPED
            return [(kind, kind == "string", self._raw(f"{rule}_{kind}", closing) if kind == "string"
                     else self._json(f"{rule}_{kind}", narrowed, closing)) for kind, narrowed in typed.items()]
        if _is_plain_string(schema) and not self.syntax.values_as_json:
            return [("string", True, self._raw(rule, closing))]
        return [("", False, self._json(rule, schema, closing))]

    def _raw(self, rule: str, closing: str) -> str:
        """Raw text: one lexeme up to the closing text (lazy: the first), or to a closing control token."""
        if self.closes_with_token:
            self.rules.append(f"VALUE_TEXT: {_ANY_TEXT}")
            return f"VALUE_TEXT? {closing}"
        self.rules.append(f"{rule}[lazy]: /(?s:.*)/ {closing}")
        return rule

    def _json(self, rule: str, schema: Mapping, closing: str) -> str:
        """The JSON the schema allows (the tool's $defs with it, for its $refs)."""
        defs = {key: self.root[key] for key in ("$defs", "definitions") if key in self.root and key not in schema}
        document = {**schema, **defs, "x-guidance": _call_json_options(schema, self.strict)}
        self.rules.append(f"{rule}: %json " + json.dumps(document, ensure_ascii=False))
        return f"{rule} {closing}".strip()


# A value's type by the name Kimi K3's template gives it (an integer is a number), from its JSON or Python type.
_TYPE_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean", "null": "null",
               "object": "object", "array": "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null", dict: "object", list: "array"}
# A schema that names no type allows each, any value of it (its other keywords left to validating the arguments).
_ANY_TYPED = {kind: grammar_schema({"type": kind}) for kind in dict.fromkeys(_TYPE_NAMES.values())}


def _by_type(schema: Any, root: Mapping, depth: int = 0) -> dict[str, Any] | None:
    """The schema narrowed to each type it allows, by _TYPE_NAMES: its enum's (or const's) values
    of that type, its types of that name, its branches that allow it; None where it names no type."""
    schema = _resolved(schema, root)
    branches = next((key for key in ("anyOf", "oneOf") if isinstance(schema, dict) and schema.get(key)), None)
    if not isinstance(schema, dict) or depth > 8:
        return None
    if schema.get("enum") or "const" in schema:
        key, named = "enum", [(_TYPE_NAMES.get(type(value), "string"), value) for value in schema.get("enum")
                              or [schema["const"]]]
    elif schema.get("type"):
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        key, named = "type", [(_TYPE_NAMES[kind], kind) for kind in kinds if kind in _TYPE_NAMES]
    elif branches is not None and isinstance(schema[branches], list):
        found = [_by_type(branch, root, depth + 1) for branch in schema[branches]]
        return None if None in found else {name: {**schema, branches: [typed[name] for typed in found if name in typed]}
                                           for typed in found for name in typed}
    else:
        return None
    return {name: {**schema, key: [item for other, item in named if other == name]} for name, _ in named}


def _resolved(schema: Any, root: Mapping) -> Any:
    """A schema whose $ref points into the tool's document as the schema it points to, its own keywords over it."""
    for _ in range(8):
        reference = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(reference, str) or not reference.startswith("#/"):
            return schema
        target: Any = root
        for part in reference[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            return schema
        schema = {**target, **{key: value for key, value in schema.items() if key != "$ref"}}
    return schema


class _Notation:
    """Values in an object notation whose strings are raw text between a marker (Gemma 4's <|"|>): objects
    {key:value,...} with bare keys, arrays [value,...], numbers (JSON), true, false, null; one rule per schema."""

    def __init__(self, prefix: str, root: Mapping, strict: bool, syntax: CallSyntax, literal,
                 special_tokens: Mapping[str, int]) -> None:
        self.prefix, self.root, self.strict, self.literal = prefix, root, strict, literal
        self.quote, self.sorts_keys, self.special_tokens = syntax.string_quote, syntax.sorts_keys, special_tokens
        self.rules: list[str] = []
        self.named: dict[str, str] = {}  # each schema's rule, by its JSON

    def key(self, key: str) -> str:
        """A key bare where a bare key holds it (the reader strips one, ending it at :{}[],<), else quoted."""
        if key and key == key.strip() and not any(character in key for character in ":{}[],<"):
            return key
        if key and self.quote not in key:
            return self.quote + key + self.quote
        raise _Unwritable(key)

    def value(self, schema: Any) -> str:
        if not isinstance(schema, dict):
            return self._any()
        identity = json.dumps(schema, sort_keys=True, ensure_ascii=False)
        if identity not in self.named:
            name = self.named[identity] = f"{self.prefix}_{len(self.named)}"
            self.rules.append(f"{name}: {self._expression(schema, name)}")
        return self.named[identity]

    def _expression(self, schema: dict, name: str) -> str:
        rest = {key: value for key, value in schema.items() if key not in ("$ref", "allOf", "anyOf", "oneOf")}
        if [type(part) for part in schema.get("allOf") or ()] == [dict]:  # one schema (pydantic's $ref, described)
            return self.value({**_resolved(schema["allOf"][0], self.root), **schema, "allOf": []})
        if "$ref" in schema:
            resolved = _resolved(schema, self.root)
            return self._any() if "$ref" in resolved else self.value(resolved)
        if "const" in schema or (isinstance(schema.get("enum"), list) and schema["enum"]):
            return " | ".join(self.literal(self._text(value)) for value in schema.get("enum") or [schema.get("const")])
        branches = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(branches, list) and branches:
            return " | ".join(self.value({**rest, **branch}) if isinstance(branch, dict) else self._any()
                              for branch in branches)
        kind = schema.get("type")
        if isinstance(kind, list):
            return " | ".join(self.value({**schema, "type": item}) for item in kind) if kind else self._any()
        kind = kind or ("object" if "properties" in schema else "array" if "items" in schema else None)
        if kind in ("number", "integer"):
            self.rules.append(f"{name}_json: %json " + json.dumps(
                {**schema, "x-guidance": _call_json_options(schema, self.strict)}, ensure_ascii=False))
            return f"{name}_json"
        simple = {"string": self._string, "boolean": lambda: '"true" | "false"', "null": lambda: '"null"',
                  "object": lambda: self._object(schema, name), "array": lambda: self._array(schema)}
        return simple.get(kind, self._any)()  # anything else (allOf of several, not, ...): any value

    def _text(self, value: Any) -> str:  # a constant
        if isinstance(value, dict):
            members = sorted(value.items(), key=lambda item: item[0].lower()) if self.sorts_keys else value.items()
            return "{" + ",".join(f"{self.key(key)}:{self._text(item)}" for key, item in members) + "}"
        if isinstance(value, list):
            return "[" + ",".join(self._text(item) for item in value) + "]"
        return self.quote + value + self.quote if isinstance(value, str) else json.dumps(value)

    def _string(self) -> str:
        items, lexeme = _text_up_to("NOTATION_TEXT", self.quote, self.special_tokens)
        self.rules += [f"notation_string: {self.literal(self.quote)} {items}", lexeme.strip()]
        return "notation_string"

    def _object(self, schema: Mapping, name: str) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:  # any keys
            return self._any().replace("any", "object")
        keys = sorted(properties, key=str.lower) if self.sorts_keys else list(properties)
        for position, key in enumerate(keys):
            self.rules.append(f"{name}_{position}: {self.literal(self.key(key) + ':')} {self.value(properties[key])}")
        required = set(schema.get("required") or ())
        self.rules += _sequence(f"{name}_members", [(f"{name}_{at}", key in required) for at, key in enumerate(keys)],
                                '","')
        return f'"{{" {name}_members "}}"'

    def _array(self, schema: Mapping) -> str:
        item = self.value(schema["items"]) if isinstance(schema.get("items"), dict) else self._any()
        at_least_one = isinstance(schema.get("minItems"), int) and schema["minItems"] >= 1
        return f'"[" {item} ("," {item})* "]"' if at_least_one else f'"[" ({item} ("," {item})*)? "]"'

    def _any(self) -> str:
        """Any value (a schema that says nothing of it)."""
        number, member = {**grammar_schema({"type": "number"}), "x-guidance": _call_json_options({}, self.strict)}, \
            'notation_key ":" notation_any'
        self.rules += [
            ('notation_any: notation_string | notation_number | "true" | "false" | "null" | notation_object | '
             'notation_array'), f'notation_object: "{{" ({member} ("," {member})*)? "}}"', "notation_number: %json "
            + json.dumps(number), 'notation_array: "[" (notation_any ("," notation_any)*)? "]"',
            "notation_key: NOTATION_KEY | notation_string", r"NOTATION_KEY: /[^:{}\[\],<\s]([^:{}\[\],<]*[^:{}\[\],<\s])?/"]
        self._string()
        return "notation_any"


def _is_plain_string(schema: Mapping) -> bool:
    """A parameter written as raw text: its schema allows strings and nothing else."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    return kind == "string" or kind == ["string"] or (isinstance(schema, Mapping) and "enum" in schema and all(
        isinstance(value, str) for value in schema["enum"]) and kind in (None, "string"))


def _reasoning_rules(reasoning: tuple[str, str] | None, reasoning_open: bool, special_tokens: Mapping[str, int],
                     literal) -> tuple[str, str]:
    """The start rule, and the rules of a reasoning block before the body."""
    if reasoning is None:
        return "start: body\n", ""
    opener, closer = reasoning
    start = "start: thought body\n" if reasoning_open else "start: thought? body\n"
    opening = "" if reasoning_open else literal(opener) + " "
    if any(closer.startswith(marker) for marker in special_tokens):  # a control token never occurs in text
        return start, f"thought: {opening}THOUGHT? {literal(closer)} SPACE?\nTHOUGHT: {_ANY_TEXT}\nSPACE: /\\s+/\n"
    # One lexeme from the opening to the closing marker: text that never holds the closer.
    opener_text = "" if reasoning_open else _lark_string(opener) + " "
    return start, (f"thought: THOUGHT\nTHOUGHT: {opener_text}({_ANY_TEXT} & ~/(?s:.*){_regex_escape(closer)}(?s:.*)/) "
                   f"{_lark_string(closer)} /\\s*/\n")


def _regex_escape(text: str) -> str:
    """`text` as a Lark /regex/ that matches it (its slashes escaped too)."""
    escaped = re.escape(text).replace("/", "\\/")
    # re.escape puts a backslash before a line break; a Lark regex must not hold one raw.
    return escaped.replace("\\\n", "\\n").replace("\\\t", "\\t").replace("\\\r", "\\r")


def _marked_literal(text: str, special_tokens: Mapping[str, int]) -> str:
    """`text` as Lark items: its control-token markers as <[id]>, the rest as strings."""
    if not text:
        return ""
    items, position = [], 0
    markers = sorted((marker for marker in special_tokens if marker), key=len, reverse=True)
    while position < len(text):
        found = min(((text.find(marker, position), -len(marker), marker) for marker in markers
                     if text.find(marker, position) >= 0), default=None)
        end = found[0] if found else len(text)
        if end > position:
            items.append(_lark_string(text[position:end]))
        if found is None:
            break
        items.append(f"<[{special_tokens[found[2]]}]>")
        position = end + len(found[2])
    return " ".join(items)
