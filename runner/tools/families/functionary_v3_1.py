"""MeetKai Functionary v3.1 (on Llama 3.1): <function=NAME>{JSON arguments}</function>, and
Python code after <|python_tag|> for the code interpreter:

    Let me check.<function=get_weather>{"city": "Paris"}</function>
    <|python_tag|>print(2 + 2)

The code runs to the end of the output (or the end-of-message token) and becomes a call of
"python" with {"code": ...}. Its template holds Llama 3.1's <|python_tag|>: this family comes
before llama3's in detection.
"""

from __future__ import annotations

import json
import re

from ..family import (CUT_OFF, Call, CallSyntax, Family, FamilyParse, ParseContext, PartialCall, arguments_json,
                      json_object_text, skip_space)
from ..partial_json import settled_prefix
from ._marked_calls import UNREADABLE, Calls, Unreadable, content_and_calls, first_of, section_reader

FUNCTION, END_FUNCTION = "<function=", "</function>"
PYTHON_TAG = "<|python_tag|>"
END_OF_MESSAGE, END_OF_TURN = "<|eom_id|>", "<|eot_id|>"
_NAME = re.compile(r"([^\s<>]+)>")
_NAME_SO_FAR = re.compile(r"[^\s<>]*\Z")


def _read_function(text: str, start: int, opener: str, context: ParseContext) -> Calls | Unreadable | PartialCall | None:
    name_start = start + len(opener)
    name = _NAME.match(text, name_start)
    if name is None:
        if not context.final and _NAME_SO_FAR.match(text, name_start):
            return None  # the name is still coming
        if _NAME_SO_FAR.match(text, name_start):
            return Unreadable(CUT_OFF, len(text))
        return Unreadable(UNREADABLE, len(text), rest_is_text=True)
    end = text.find(END_FUNCTION, name.end())
    if end < 0:  # not closed yet: its arguments stream, as arguments_json will write them
        if context.final:
            return Unreadable(CUT_OFF, len(text))
        body = skip_space(text, name.end())
        return PartialCall(name.group(1), settled_prefix(text[body:])) if text.startswith("{", body) else None
    arguments = json_object_text(text[name.end():end] or "{}")
    if arguments is None:
        return Unreadable(UNREADABLE, end + len(END_FUNCTION))
    return Calls((Call(name.group(1), arguments_json(json.loads(arguments))),), end + len(END_FUNCTION))


def _read_python(text: str, start: int, opener: str, context: ParseContext) -> Calls | None:
    """The code after the tag, to an end token or the end of the output."""
    code_start = start + len(opener)
    end, token = first_of(text, (END_OF_MESSAGE, END_OF_TURN), code_start)
    if token is None and not context.final:
        return None
    code = text[code_start:end if token else len(text)]
    return Calls((Call("python", _code_arguments(code)),), end + len(token) if token else len(text))


def _code_arguments(code: str) -> str:
    """{"code": ...}; a model that writes the arguments' JSON after the tag (as the template
    renders past calls) gives them as they are."""
    written = json_object_text(code)
    if written is None:
        try:
            decoded = json.loads(code)
        except ValueError:
            decoded = None
        written = json_object_text(decoded) if isinstance(decoded, str) else None
    return arguments_json(json.loads(written)) if written else arguments_json({"code": code.strip()})


# A function comes when </function> closes it; the code after the tag at an end token.
@section_reader((END_FUNCTION, END_OF_MESSAGE, END_OF_TURN))
def _read_section(text: str, start: int, opener: str, context: ParseContext) -> Calls | Unreadable | PartialCall | None:
    reader = _read_python if opener == PYTHON_TAG else _read_function
    return reader(text, start, opener, context)


_read_section.streams_calls = True  # a function's arguments stream: read again at a pace


def parse(text: str, context: ParseContext) -> FamilyParse:
    return content_and_calls(text, context, (FUNCTION, PYTHON_TAG), _read_section,
                             hidden=(END_OF_MESSAGE, END_OF_TURN))


FAMILY = Family(
    name="functionary-v3.1",
    description='<function=NAME>{...}</function> or <|python_tag|>code (Functionary v3.1 on Llama 3.1)',
    parse=parse,
    fingerprints=((FUNCTION, END_FUNCTION, "<|start_header_id|>"),),
    markers=(FUNCTION, END_FUNCTION, PYTHON_TAG, END_OF_MESSAGE, END_OF_TURN),
    priority=60,  # before llama3 (85), whose fingerprint <|python_tag|> its template holds too
    # The template writes a "python" call back as <|python_tag|> and its arguments' JSON: a
    # constrained call of a tool named python is written in the <function=...> form all the same.
    call_syntax=CallSyntax(call_open=FUNCTION + "{name}>", call_close=END_FUNCTION),
)
