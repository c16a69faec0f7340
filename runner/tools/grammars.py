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
from collections.abc import Sequence

from ..schema import grammar_schema, json_options
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
