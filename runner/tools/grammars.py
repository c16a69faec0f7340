"""The grammar that makes every tool call valid: llguidance Lark over the request's tools.

One grammar per (format, tools, choice, parallel): `required` and a named function constrain
the output from its first token to calls whose arguments follow each tool's `parameters`;
`auto` leaves the model free until it writes the format's trigger (`<tool_call>`, a leading
`{`, `[TOOL_CALLS]`), then constrains the call (llguidance's lazy lexemes: free text ends at
the trigger, and from there the JSON is forced); `none` has no grammar. Each call's JSON is
written with fixed separators (", " and ": "), exactly as `json.dumps` writes it, so that a
call re-rendered into the next turn's prompt matches the tokens the model generated.

Grammars are text, built in microseconds; llguidance compiles each distinct one once (the
constraint cache in runner/grammar.py keys on the text), so an agent that sends the same tools
every turn pays for the compile once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from ..schema import grammar_schema, json_options
from .family import CallSyntax
from .types import ChoiceMode, Tool, ToolChoice, ToolFormat

# A call's arguments are JSON with no free whitespace and json.dumps' separators (see the module
# docstring); lenient: keywords llguidance cannot enforce are left to validating the arguments.
CALL_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
MISTRAL_OPEN = "[TOOL_CALLS]"
# Any text; free text in `auto` is this minus the format's trigger.
_ANY_TEXT = "/(?s:.*)/"


def _arguments_key(tool_format: ToolFormat) -> str:
    return "parameters" if tool_format is ToolFormat.LLAMA3 else "arguments"


def _lark_string(text: str) -> str:
    """A Lark string literal of `text` (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def arguments_json(tool: Tool) -> str:
    """A tool's arguments as an llguidance %json: its own document (so its $defs and $refs
    resolve within it), narrowed as every grammar's schema is (declared properties only where it
    leaves others unsaid, numbers of bounded length: runner.schema.grammar_schema) so calls end."""
    schema = grammar_schema(tool.schema)
    options = {**json_options(schema, strict=tool.strict), **CALL_JSON_OPTIONS}
    options.pop("whitespace_pattern", None)  # it would allow free whitespace after all
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def _call_rules(tools: Sequence[Tool], tool_format: ToolFormat) -> str:
    """`call`: one of the tools' calls, written {"name": "<name>", "arguments": <its arguments>}
    as json.dumps writes it; one rule per tool, its arguments a %json of their own."""
    key = _arguments_key(tool_format)
    rules = [f"call: {' | '.join(f'call_{index}' for index in range(len(tools)))}"]
    for index, tool in enumerate(tools):
        head = '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + f', "{key}": '
        rules.append(f'call_{index}: {_lark_string(head)} args_{index} "}}"')
        rules.append(f"args_{index}: {arguments_json(tool)}")
    return "\n".join(rules) + "\n"


def _offered(tools: Sequence[Tool], choice: ToolChoice) -> list[Tool]:
    if choice.mode is ChoiceMode.FUNCTION:
        named = [tool for tool in tools if tool.name == choice.name]
        if not named:
            raise ValueError(f"tool_choice names the function {choice.name!r}, which is not among the tools")
        return named
    return list(tools)


def tool_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool, tool_format: ToolFormat,
                 reasoning: bool = False) -> str | None:
    """The Lark grammar of a request's output (None: nothing to constrain, tool_choice none).
    A named function and `parallel` false allow one call; `required` and `auto` with
    `parallel` allow one or more. `reasoning`: the model may think first (<think>...</think>)."""
    if choice.mode is ChoiceMode.NONE or not tools:
        return None
    offered = _offered(tools, choice)
    many = parallel and choice.mode is not ChoiceMode.FUNCTION
    build = {ToolFormat.HERMES: _hermes, ToolFormat.GENERIC: _generic, ToolFormat.LLAMA3: _llama3,
             ToolFormat.MISTRAL: _mistral}[tool_format]
    rules = build(offered, tool_format, choice.forces_call, many)
    start = "start: THINK? body\n" if reasoning else "start: body\n"
    think = 'THINK: "<think>" (/(?s:.*)/ & ~/(?s:.*)<\\/think>(?s:.*)/) "</think>" /\\s*/\n' if reasoning else ""
    return "%llguidance {}\n" + start + rules + think


def _free_text_without(trigger_regex: str) -> str:
    """Free text that never holds the trigger (so writing it always starts a call)."""
    return f"TEXT: {_ANY_TEXT} & ~/(?s:.*){trigger_regex}(?s:.*)/\n"


def _hermes(tools: Sequence[Tool], tool_format: ToolFormat, forced: bool, many: bool) -> str:
    block = f'"{HERMES_OPEN}\\n" call "\\n{HERMES_CLOSE}"'
    more = ' ("\\n" block)*' if many else ""
    if forced:
        body = f"body: block{more}\n"
    else:  # free text, ended lazily by the trigger; then the call(s), then nothing but the end
        body = (f"body: TEXT | head call_end{more}\n"
                f'head[lazy]: TEXT "{HERMES_OPEN}"\n'
                f'call_end: "\\n" call "\\n{HERMES_CLOSE}"\n' + _free_text_without("<tool_call>"))
    return body + f"block: {block}\n" + _call_rules(tools, tool_format)


def _call_list(many: bool) -> str:
    """`calls`: one call, or with `many` one or more, as a JSON array."""
    return 'calls: "[" call ("," " " call)* "]"\n' if many else 'calls: "[" call "]"\n'


def _generic(tools: Sequence[Tool], tool_format: ToolFormat, forced: bool, many: bool) -> str:
    rules = 'whole: "{\\"tool_calls\\": " calls "}"\n' + _call_list(many) + _call_rules(tools, tool_format)
    if forced:
        return "body: whole\n" + rules
    # Free text that does not begin with "{"; an output that begins with "{" is the calls.
    return "body: TEXT | whole\n" + rules + "TEXT: /([^{](?s:.*))?/\n"


def _llama3(tools: Sequence[Tool], tool_format: ToolFormat, forced: bool, many: bool) -> str:
    more = ' ("; " call)*' if many else ""
    if forced:
        return f"body: call{more}\n" + _call_rules(tools, tool_format)
    return f"body: TEXT | call{more}\n" + _call_rules(tools, tool_format) + "TEXT: /([^{](?s:.*))?/\n"


def _mistral(tools: Sequence[Tool], tool_format: ToolFormat, forced: bool, many: bool) -> str:
    rules = _call_list(many) + _call_rules(tools, tool_format)
    if forced:
        return f'body: "{MISTRAL_OPEN}" calls\n' + rules
    return (f"body: TEXT | head calls\n"
            f'head[lazy]: TEXT "{MISTRAL_OPEN}"\n' + rules + _free_text_without("\\[TOOL_CALLS\\]"))


# --- a family's own syntax (runner/tools/family.py's CallSyntax) ------------------------------------

def family_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool, syntax: CallSyntax,
                   special_tokens: Mapping[str, int], reasoning: tuple[str, str] | None = None,
                   reasoning_open: bool = False) -> str | None:
    """The Lark grammar of calls written in a family's syntax. `special_tokens`: the markers
    that are control tokens of the vocabulary (by text), required as those tokens (llguidance's
    <[id]>); `reasoning`: the family's reasoning markers, a block the model may write first (or,
    with `reasoning_open`, is already inside: the prompt opened it)."""
    if choice.mode is ChoiceMode.NONE or not tools or (not choice.forces_call and not syntax.constrains_auto):
        return None
    offered = _offered(tools, choice)
    many = parallel and choice.mode is not ChoiceMode.FUNCTION

    def literal(text: str) -> str:
        return _marked_literal(text, special_tokens)

    # The trigger starts the calls in free text: the block's opening, or each call's opening up
    # to the function's name. A call is its trigger (where the block has none) and its tail.
    trigger = syntax.block_open or syntax.call_open.split("{", 1)[0]
    call_trigger = "" if syntax.block_open else trigger
    rules = [f"call: {literal(call_trigger)} tail".strip(),
             f"tail: {' | '.join(f'tail_{index}' for index in range(len(offered)))}"]
    for index, tool in enumerate(offered):
        opening = syntax.call_open.replace("{name}", tool.name)[len(call_trigger):]
        head, has_index, rest = opening.partition("{index}")
        items = [literal(head), "INDEX" if has_index else "", literal(rest), f"args_{index}", literal(syntax.call_close)]
        rules.append(f"tail_{index}: " + " ".join(item for item in items if item))
        if syntax.parameter_open is None:
            rules.append(f"args_{index}: {arguments_json(tool)}")
        else:
            rules += _parameter_rules(f"args_{index}", tool, syntax, literal, special_tokens)
    more = " (" + " ".join(item for item in (literal(syntax.separator), "call") if item) + ")*" if many else ""
    ending = f" {literal(syntax.block_close)}" if syntax.block_close else ""
    if choice.forces_call:
        body = f"body: {literal(syntax.block_open)} call{more}{ending}\n".replace("body:  ", "body: ")
    elif any(trigger.startswith(marker) for marker in special_tokens):
        # Free text never holds a control token: writing the token starts the calls.
        opening = literal(syntax.block_open) + " call" if syntax.block_open else "call"
        body = f"body: TEXT | TEXT? {opening}{more}{ending}\nTEXT: {_ANY_TEXT}\n"
    else:
        # Free text ends lazily at the trigger (it never holds one), then the calls.
        rest = "call" if syntax.block_open else "tail"
        body = (f"body: TEXT | head {rest}{more}{ending}\n" f"head[lazy]: TEXT {literal(trigger)}\n"
                + _free_text_without(_regex_escape(trigger)))
    if reasoning is not None and syntax.reasoning is not None:
        reasoning = syntax.reasoning
    start, thought = _reasoning_rules(reasoning, reasoning_open, special_tokens, literal)
    index = "INDEX: /[0-9]+/\n" if "{index}" in syntax.call_open else ""
    return "%llguidance {}\n" + start + body + "\n".join(rules) + "\n" + thought + index


def _parameter_rules(name: str, tool: Tool, syntax: CallSyntax, literal, special_tokens: Mapping[str, int]) -> list[str]:
    """A call's arguments as one block per parameter, in the order the schema declares them,
    the required ones present: a string's value is raw text up to the block's end (never
    holding it), any other value the JSON its schema allows."""
    schema = grammar_schema(tool.schema)
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or ())
    if not properties:  # a function without parameters: nothing between its opening and close
        return [f'{name}: ""']
    items, rules = [], []
    for position, (key, sub_schema) in enumerate(properties.items()):
        rule = f"{name}_{position}"
        closing = literal(syntax.parameter_close.replace("{key}", key))
        is_text = _is_plain_string(sub_schema)
        opening = literal(syntax.parameter_open.replace("{key}", key).replace("{string}", "true" if is_text else "false"))
        if is_text:
            # One lexeme up to the closing text (lazy: it ends at the first one); a control
            # token never occurs in text, so there the closing token itself ends the value.
            if any(syntax.parameter_close.startswith(marker) for marker in special_tokens):
                rules.append(f"{rule}: {opening} VALUE_TEXT? {closing}")
            else:
                rules.append(f"{rule}: {opening} {rule}_value")
                rules.append(f"{rule}_value[lazy]: /(?s:.*)/ {closing}")
        else:
            value_schema = {**sub_schema, "x-guidance": {**json_options(sub_schema, strict=tool.strict), **CALL_JSON_OPTIONS}}
            value_schema["x-guidance"].pop("whitespace_pattern", None)
            rules.append(f"{rule}: {opening} {rule}_value {closing}")
            rules.append(f"{rule}_value: %json " + json.dumps(value_schema, ensure_ascii=False))
        items.append(rule if key in required else f"{rule}?")
    rules.append(f"{name}: " + " ".join(items))
    if any(" VALUE_TEXT? " in rule for rule in rules):
        rules.append(f"VALUE_TEXT: {_ANY_TEXT}")
    return rules


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
