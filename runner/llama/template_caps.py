"""What a chat template does with what it is given: system messages, content as text or as
parts, tools, calls with their arguments as objects, reasoning kept in the history.

Found as llama.cpp finds it (common/jinja/caps.cpp): the template is rendered with probe
conversations whose values record what the template did with them (read a field, tested its
type, looped over it), and each answer is read off those records. llama-server shapes the
messages it renders by these answers (merges a system message into the first user turn where
the template ignores it, writes a call's arguments as an object where the template reads one),
so rendering the same way gives the same prompt.

The probes render with a sandboxed jinja2 environment whose lookups note the use of the probe
values (`TrackingEnvironment`); a probe that fails to render says so in its answer, as it does
in llama.cpp.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2

# What a template's rendering raises when it fails or refuses (a probe's answer, a request's 400).
RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError,
                RecursionError)


@dataclass(frozen=True)
class TemplateCaps:
    """llama.cpp's capabilities of a template (jinja::caps), under the same names."""

    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_system_role: bool = True
    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_object_arguments: bool = False
    supports_parallel_tool_calls: bool = True
    supports_preserve_reasoning: bool = False
    supports_reasoning_effort: bool = False


class _Stats:
    """What a template did with one probe value: whether it used it, and how."""

    __slots__ = ("used", "ops")

    def __init__(self) -> None:
        self.used = False
        self.ops: set[str] = set()


class _Tracked:
    """A probe value: marks itself used where llama.cpp's engine would."""

    stats: _Stats

    def _used(self, op: str | None = None) -> None:
        mark_used(self, op=op)


class TrackedStr(str, _Tracked):
    def __new__(cls, value: str) -> TrackedStr:
        made = super().__new__(cls, value)
        made.stats = _Stats()
        return made

    def __iter__(self):
        # llama.cpp's engine loops over lists and objects only: a loop over a string fails.
        self._used("array_access")
        raise TypeError("cannot loop over a string")

    def __str__(self) -> str:
        self._used()
        return str.__str__(self)

    def __eq__(self, other: object) -> bool:
        self._used()
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        self._used()
        return str.__ne__(self, other)

    # What a template does with a name that holds the value (llama.cpp marks a value used where a
    # name is looked up): test it, add it to text.
    def __len__(self) -> int:
        self._used()
        return str.__len__(self)

    def __add__(self, other: str) -> str:
        self._used()
        return str.__add__(str.__str__(self), other)

    def __radd__(self, other: str) -> str:
        self._used()
        return str.__add__(other, str.__str__(self))

    __hash__ = str.__hash__


class TrackedList(list, _Tracked):
    def __init__(self, items) -> None:
        super().__init__(items)
        self.stats = _Stats()

    def __iter__(self):
        self._used("array_access")
        return super().__iter__()


class TrackedDict(dict, _Tracked):
    def __init__(self, items) -> None:
        super().__init__(items)
        self.stats = _Stats()

    def __iter__(self):
        self._used("object_access")
        return super().__iter__()


def tracked(value: Any) -> Any:
    """A JSON value as probe values, every string, list and object its own record."""
    if isinstance(value, str):
        return TrackedStr(value)
    if isinstance(value, list):
        return TrackedList(tracked(item) for item in value)
    if isinstance(value, dict):
        return TrackedDict((key, tracked(item)) for key, item in value.items())
    return value


def untracked(value: Any) -> Any:
    """A probe value as plain values (what a filter that reads it whole is given)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [untracked(item) for item in list.__iter__(value)]
    if isinstance(value, dict):
        return {key: untracked(item) for key, item in dict.items(value)}
    return value


def mark_used(value: Any, deep: bool = False, op: str | None = None) -> None:
    if isinstance(value, _Tracked):
        value.stats.used = True
        if op is not None:
            value.stats.ops.add(op)
    if deep and isinstance(value, list):
        for item in list.__iter__(value):
            mark_used(item, deep=True)
    elif deep and isinstance(value, dict):
        for item in dict.values(value):
            mark_used(item, deep=True)


def with_tracking(environment_class: type[jinja2.Environment]) -> type[jinja2.Environment]:
    """`environment_class` whose item and attribute lookups, filters and tests mark the probe
    values they touch (llama.cpp: member access, built-in functions and tests)."""

    class TrackingEnvironment(environment_class):  # type: ignore[misc, valid-type]
        def getitem(self, obj, argument):
            return self._looked_up(obj, argument, super().getitem(obj, argument))

        def getattr(self, obj, attribute):
            found = super().getattr(obj, attribute)
            if isinstance(obj, _Tracked) and not (isinstance(obj, dict) and attribute in obj):
                mark_used(obj, op=attribute)  # a method (startswith, items): llama.cpp's built-in
                return found
            return self._looked_up(obj, attribute, found)

        @staticmethod
        def _looked_up(obj, key, found):
            if isinstance(found, jinja2.Undefined):
                return found
            mark_used(found)
            if isinstance(obj, _Tracked):
                mark_used(obj, op="array_access" if isinstance(key, (int, bool)) else "object_access")
            return found

    return TrackingEnvironment


def tracking_filter(name: str, function: Callable) -> Callable:
    """A filter that marks its input as llama.cpp's built-in of the same name does (tojson deep)."""
    def filtered(*args, **kwargs):
        if args:
            at = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0
            if isinstance(args[at], Iterator):  # what jinja2 leaves lazy (map, select) llama.cpp makes a list
                args = (*args[:at], list(args[at]), *args[at + 1:])
            mark_used(args[at], deep=name in ("tojson", "string"), op=name)
            if name == "tojson":  # llama.cpp's tojson reads the value whole: no loop of the template's
                args = (*args[:at], untracked(args[at]), *args[at + 1:])
        return function(*args, **kwargs)

    if hasattr(function, "jinja_pass_arg"):  # what jinja2 hands first (the context): the filter's own
        filtered.jinja_pass_arg = function.jinja_pass_arg
    return filtered


def tracking_test(name: str, function: Callable) -> Callable:
    def tested(value, *args, **kwargs):
        mark_used(value, op=f"test_is_{name}")
        return function(value, *args, **kwargs)

    return tested


Render = Callable[[dict[str, Any]], str]


def _probe(render: Render, variables: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    """Render with probe values: (whether it rendered, the text, the probe values)."""
    values = {name: tracked(value) for name, value in variables.items()}
    try:
        return True, render(values), values
    except RENDER_ERRORS:
        return False, "", values


def _used(value: Any) -> bool:
    return isinstance(value, _Tracked) and value.stats.used


def _ops(value: Any) -> set[str]:
    return value.stats.ops if isinstance(value, _Tracked) else set()


_TOOLS = [{"name": "tool", "type": "function", "function": {
    "name": "tool1", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                   "required": ["arg"]}}}]
_REASONING_PLACEHOLDER = "<REASONING_CONTENT_PLACEHOLDER>"
_CONTENT_MARKER = "STRING_MARKER"


def _base(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"messages": messages, "tools": tools if tools is not None else [], "bos_token": "", "eos_token": "",
            "add_generation_prompt": True}


def _call_history(arguments: Any, calls: int = 1) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call0000{number}", "type": "function", "function": {"name": "tool1", "arguments": arguments}}
            for number in range(1, calls + 1)]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def probe_caps(render: Render, preserve_reasoning: Callable[[bool], dict[str, Any]],
               reasoning_effort: Callable[[str], dict[str, Any]]) -> TemplateCaps:
    """The template's capabilities. `render` renders it with the given variables (a tracking
    environment's template); the two others give the variables llama.cpp sets for its
    preserve_reasoning and reasoning_effort switches."""
    found: dict[str, bool] = {}

    ok, text, values = _probe(render, _base([{"role": "user", "content": _CONTENT_MARKER}]))
    content = values["messages"][0]["content"]
    checks_for_string = "test_is_string" in _ops(content)
    used_as_array = bool(_ops(content) & {"selectattr", "array_access"})
    found["supports_typed_content"] = used_as_array
    found["supports_string_content"] = ok and not (used_as_array and _CONTENT_MARKER not in text)
    if checks_for_string:
        ok, _text, values = _probe(render, _base([{"role": "user", "content": []}]))
        if ok and _ops(values["messages"][0]["content"]) & {"selectattr", "array_access"}:
            found["supports_typed_content"] = True

    _ok, _text, values = _probe(render, _base([{"role": "system", "content": "System message"},
                                               {"role": "user", "content": "User message"}]))
    found["supports_system_role"] = _used(values["messages"][0]["content"])

    tools = _tool_caps(render)
    found.update(tools)
    arguments = {"arg": "value"} if tools.get("supports_object_arguments") else '{"arg": "value"}'
    ok, _text, values = _probe(render, _base(_call_history(arguments, calls=2), _TOOLS))
    found["supports_parallel_tool_calls"] = ok and _used(values["messages"][1]["tool_calls"][1]["function"])

    history = [{"role": "user", "content": "User message"},
               {"role": "assistant", "content": "Assistant message", "reasoning_content": _REASONING_PLACEHOLDER},
               {"role": "user", "content": "User message"},
               {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
               {"role": "user", "content": "User message"}]
    _ok, text, _values = _probe(render, _base(history) | {"enable_thinking": True} | preserve_reasoning(True))
    found["supports_preserve_reasoning"] = _REASONING_PLACEHOLDER in text

    effort = reasoning_effort("low")
    _ok, _text, values = _probe(render, _base([{"role": "user", "content": "User message"}])
                                | {"enable_thinking": True} | effort)
    found["supports_reasoning_effort"] = any(_used(values[name]) for name in effort)
    return TemplateCaps(**found)


def _tool_caps(render: Render) -> dict[str, bool]:
    """supports_tools, supports_tool_calls and supports_object_arguments: a call with object
    arguments first, then (where the arguments were not read as an object) with text ones;
    each probe may only take a capability away."""
    found: dict[str, bool] = {}
    for arguments in ({"arg": "value"}, '{"arg": "value"}'):
        ok, _text, values = _probe(render, _base(_call_history(arguments), _TOOLS))
        if not ok:
            if isinstance(arguments, str):
                found.update(supports_tools=False, supports_tool_calls=False)
            continue
        if not _used(values["tools"][0]["function"]["name"]):
            found["supports_tools"] = False
        calls = values["messages"][1]["tool_calls"]
        if not _used(calls):
            found["supports_tool_calls"] = False
        elif isinstance(arguments, dict) and _used(calls[0]["function"]["arguments"]["arg"]):
            found["supports_object_arguments"] = True
            break
    return found


# --- whether the template reasons (llama-server's default for enable_thinking) -----------------

_USER = {"role": "user", "content": "U_USER_MSG Hello END_U"}
_ANSWER = "A_ASST_MSG I can help END_A"
_THOUGHT = "REASON_PART I am thinking END_R"
_MARKER_AFTER = re.compile(r"\s*(<[^>]*>|\[[^\]]*\])")
_MARKERS = re.compile(r"<[^>]*>|\[[^\]]*\]")
_TAIL = 64
# Templates llama.cpp's analysis is told reason (its autoparser's workarounds): Qwen's and
# DeepSeek's older templates cut the reasoning off past turns, Granite 3.3 asks for it in text,
# Nemotron Nano v2 writes it with numbered special tokens.
_REASONING_WORKAROUNDS = (
    lambda source: ("content.split('</think>')" in source and "reasoning_content" not in source
                    and "<SPECIAL_12>" not in source),
    lambda source: "Write your thoughts between <think></think> and write your response between <response></response>"
                   in source,
    lambda source: all(part in source for part in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")),
)


def template_reasons(render: Render, source: str) -> bool:
    """Whether the template has the model reason, as llama.cpp's analysis of a template decides
    it (common/chat-diff-analyzer.cpp, analyze_reasoning): a past turn's reasoning is written
    with a marker after it, or enable_thinking adds or removes markers at the prompt's end.
    `render` renders the template (plain values) with the given variables."""
    if any(applies(source) for applies in _REASONING_WORKAROUNDS):
        return True

    def rendered(messages: list[dict[str, Any]], add_generation_prompt: bool, enable_thinking: bool,
                 tools: list[dict[str, Any]] | None = None) -> str | None:
        variables = {"messages": messages, "bos_token": "", "eos_token": "", "enable_thinking": enable_thinking,
                     "add_generation_prompt": add_generation_prompt}
        if tools:
            variables["tools"] = tools
        try:
            return render(variables)
        except RENDER_ERRORS:
            return None

    past = [_USER, {"role": "assistant", "content": _ANSWER, "reasoning_content": _THOUGHT}]
    if _marked_thought(rendered(past, False, True)):
        return True
    off, on = rendered([_USER], True, False), rendered([_USER], True, True)
    if off is not None and on is not None and off != on and _ends_differ_by_markers(off, on):
        return True
    with_call = [_USER, {"role": "assistant", "content": None, "reasoning_content": _THOUGHT, "tool_calls": [
        {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": {"arg": "value"}}}]}]
    alone, beside_call = rendered(past, False, True, _TOOLS), rendered(with_call, False, True, _TOOLS)
    return (alone is not None and _THOUGHT not in alone) and _marked_thought(beside_call)


def _marked_thought(text: str | None) -> bool:
    """Whether the reasoning stands in the text with a marker (<...> or [...]) after it."""
    if text is None or _THOUGHT not in text:
        return False
    return bool(_MARKER_AFTER.match(text, text.index(_THOUGHT) + len(_THOUGHT)))


def _ends_differ_by_markers(off: str, on: str) -> bool:
    """enable_thinking changes the prompt's end: one rendering is the other plus text ending it
    (the reasoning's opener, or an empty reasoning block), or one adds two markers after the
    other's last characters."""
    prefix = len(_common_prefix(off, on))
    suffix = len(_common_prefix(off[prefix:][::-1], on[prefix:][::-1]))
    left, right = off[prefix:len(off) - suffix], on[prefix:len(on) - suffix]
    if not left.strip() and right.strip():
        return on.endswith(right.strip())
    if not right.strip() and left.strip():
        return off.endswith(left.strip())
    for base, extended in ((on, off), (off, on)):
        anchor = base[-_TAIL:]
        at = extended.rfind(anchor)
        if at < 0 or at + len(anchor) >= len(extended):
            continue
        extra = extended[at + len(anchor):].strip()
        if extra and len(_MARKERS.findall(extra)) == 2 and not _MARKERS.sub("", extra).strip():
            return True
    return False


def _common_prefix(a: str, b: str) -> str:
    size = 0
    for x, y in zip(a, b):
        if x != y:
            break
        size += 1
    return a[:size]
