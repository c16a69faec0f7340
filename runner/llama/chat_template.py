"""Chat templates: a Jinja template (the GGUF's, a file or text), or a llama.cpp built-in name.

A Jinja template is rendered here with jinja2, in a sandbox, as llama-server renders it with its
own Jinja engine (common/jinja): the same variables and the same shaping of the messages
(template_input.py), by what the template does with them (template_caps.py), and the same
whitespace rules (trim_blocks, lstrip_blocks). llama.cpp's llama_chat_apply_template knows only
its built-in templates, which it recognises by name or by substrings of a template's text: those
are used for a built-in name (--chat-template chatml) and for a GGUF template jinja2 cannot
compile.

This module does not import llama_cpp: the backend hands it the built-in names and the BOS
and EOS texts.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.runtime import LoopContext
from jinja2.utils import Namespace
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .template_caps import (RENDER_ERRORS, TemplateCaps, probe_caps, template_reasons, tracking_filter, tracking_test,
                            with_tracking)
from .template_input import (preserve_reasoning_names, reasoning_effort_names, template_messages, template_tools,
                             template_variables)

_JINJA_MARKERS = ("{{", "{%")
_TEMPLATE_FILE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".tmpl", ".txt")


@dataclass(frozen=True)
class ChatTemplate:
    """How chat messages become a prompt: `jinja_source` rendered with jinja2 (as llama-server
    renders a template), else `llama_name` handed to llama.cpp (a built-in name, or a template
    text it recognises one in)."""

    llama_name: str | None
    jinja_source: str | None
    description: str  # for error messages: where the template came from

    @classmethod
    def builtin(cls, name: str) -> ChatTemplate:
        return cls(name, None, f"llama.cpp's {name!r} template")

    @classmethod
    def jinja(cls, source: str, description: str) -> ChatTemplate:
        compile_jinja(source, description)  # a broken template is an error now, not per request
        return cls(None, source, description)

    @classmethod
    def embedded(cls, source: str) -> ChatTemplate:
        """The GGUF's own template, rendered with jinja2; where jinja2 cannot compile it, the
        text goes to llama.cpp, which renders the built-in template it recognises in it."""
        try:
            compile_jinja(source, "the model's chat template")
        except ValueError:
            return cls(source, None, "the model's chat template (as llama.cpp recognises it)")
        return cls(None, source, "the model's chat template")


def load_chat_template(value: str, builtin_names: Collection[str]) -> ChatTemplate:
    """A chat template from what a user gave: a path to a Jinja file, Jinja text, or one of
    llama.cpp's built-in names. ValueError says what is wrong (a missing or unreadable file,
    a template that does not compile, an unknown name)."""
    path = Path(value)
    if _is_file(path):
        return ChatTemplate.jinja(_read_template_file(path), f"chat template file {path}")
    if any(marker in value for marker in _JINJA_MARKERS):
        return ChatTemplate.jinja(value, "the chat template text")
    if value in builtin_names:
        return ChatTemplate.builtin(value)
    if "/" in value or path.suffix in _TEMPLATE_FILE_SUFFIXES:
        raise ValueError(f"chat template file not found: {value}")
    raise ValueError(f"unknown chat template {value!r}: give a Jinja template file, or one of llama.cpp's "
                     f"built-in templates: {', '.join(sorted(builtin_names))}")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long to be a path, or holding a NUL
        return False


def _read_template_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read chat template file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"chat template file {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def _raise_exception(message: str) -> None:
    """What templates call to refuse a conversation (Hugging Face's convention)."""
    raise jinja2.TemplateError(message)


def _strftime(now: datetime.datetime):
    return lambda date_format: now.strftime(date_format)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    """Hugging Face's tojson: json.dumps with keys in their order and no HTML escaping (jinja2's
    own sorts keys and escapes <, > and &, so a re-rendered tool call would not match the text
    the model generated). What jinja2 leaves as an iterator (a `map` filter's output) is the list
    llama.cpp's engine makes of it."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_json_list)


def _json_list(value: object) -> list:
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _GenerationBlocks(Extension):
    """Hugging Face's {% generation %}...{% endgeneration %} (it marks what the assistant wrote,
    for training): the body is rendered as it stands, as llama.cpp renders it."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _TemplateSandbox(ImmutableSandboxedEnvironment):
    """The sandbox a template runs in, with llama.cpp's engine's rules where jinja2's differ: a
    list may grow or shrink (append, pop: Kimi K2's template gathers the names of the calls so),
    nothing else may change; a string plus null or an undefined name is the string (Firefunction
    v2's template adds its undefined `functions` to its system prompt).

    A template reads a message's fields hundreds of times per render, so the sandbox's checks are
    spared where their answer is known: a field of a plain dict is its value, so is a public name
    of a namespace or a loop, and whether an attribute may be read is decided once per type and
    name."""

    intercepted_binops = frozenset({"+"})
    _safe_methods: dict[tuple[type, str], bool] = {}

    def call_binop(self, context, operator, left, right):
        if operator == "+":
            if _is_null(left) and isinstance(right, str):
                return right
            if _is_null(right) and isinstance(left, str):
                return left
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj, attribute):
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            # What the sandbox gives after finding no attribute of that name: the item, or undefined.
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if kind in _TEMPLATE_OBJECTS and not attribute.startswith("_"):  # ns.found, loop.index0
            try:
                return getattr(obj, attribute)
            except AttributeError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj, attr, value) -> bool:
        # jinja2's checks read only the object's type and the attribute's name.
        kind = type(obj)
        known = self._safe_methods.get((kind, attr))
        if known is None:
            if kind is list and attr in ("append", "pop"):
                known = super(ImmutableSandboxedEnvironment, self).is_safe_attribute(obj, attr, value)
            else:
                known = super().is_safe_attribute(obj, attr, value)
            self._safe_methods[(kind, attr)] = known
        return known


_DICT_ATTRIBUTES = frozenset(dir(dict))
_TEMPLATE_OBJECTS = (Namespace, LoopContext)  # what a template makes itself: its public names are its values


def _is_null(value: object) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


def _environment(tracking: bool) -> jinja2.Environment:
    """The sandbox templates run in; `tracking`: one whose lookups, filters and tests note what
    they touch of probe values (for TemplateCaps)."""
    environment_class = with_tracking(_TemplateSandbox) if tracking else _TemplateSandbox
    environment = environment_class(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols", _GenerationBlocks])
    environment.globals.update(raise_exception=_raise_exception,
                               strftime_now=lambda date_format: datetime.datetime.now().strftime(date_format))
    environment.filters["tojson"] = _tojson
    # No HTML in a prompt: `safe` marks nothing (jinja2's Markup would escape what is added to it).
    environment.filters["safe"] = str
    if tracking:
        environment.filters = {name: tracking_filter(name, function) for name, function in environment.filters.items()}
        environment.tests = {name: tracking_test(name, function) for name, function in environment.tests.items()}
    return environment


def compile_jinja(source: str, description: str, tracking: bool = False) -> jinja2.Template:
    """Compile a chat template in a sandbox; ValueError names the line of a syntax error."""
    try:
        return _environment(tracking).from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"{description} does not compile: line {error.lineno}: {error.message}") from None


class JinjaRenderer:
    """A compiled Jinja chat template with the model's BOS and EOS texts, rendered as
    llama-server renders it (template_input.py says with what)."""

    def __init__(self, source: str, description: str, bos_token: str, eos_token: str, add_bos: bool,
                 add_eos: bool = False) -> None:
        self.source = source
        self._template = compile_jinja(source, description)
        self._description = description
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._add_bos = add_bos
        self._add_eos = add_eos
        self._caps: TemplateCaps | None = None
        self._reasons: bool | None = None

    @property
    def caps(self) -> TemplateCaps:
        """What the template does with what it is given (probed at the first render: ~10 renders)."""
        if self._caps is None:
            tracking = compile_jinja(self.source, self._description, tracking=True)
            self._caps = probe_caps(lambda variables: tracking.render(**variables), preserve_reasoning_names,
                                    reasoning_effort_names)
        return self._caps

    @property
    def reasons(self) -> bool:
        """Whether the template has the model reason: a chat is rendered with enable_thinking
        true unless it says otherwise (llama-server's default)."""
        if self._reasons is None:
            self._reasons = template_reasons(lambda variables: self._template.render(**variables), self.source)
        return self._reasons

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               options: Mapping[str, Any] | None = None, enable_thinking: bool | None = None,
               adjust: Callable[[list[dict]], list[dict]] | None = None, keeps_developer_role: bool = False,
               now: datetime.datetime | None = None, generation_prompt: bool = True) -> str:
        """The prompt text, ending where the model speaks (generation_prompt False: where the last
        message ends); ValueError when the template fails or refuses the messages. `adjust`: a
        family's own shaping of the messages after the common one; `options`: the request's
        chat_template_kwargs and switches; `enable_thinking`: the default where options do not
        say (None: whether the template reasons)."""
        now = now or datetime.datetime.now()
        try:
            shaped = template_messages(messages, self.caps, keeps_developer_role)
            if adjust is not None:
                shaped = adjust(shaped)
        except ValueError as error:
            raise ValueError(f"{self._description} failed: {error}") from None
        variables: dict[str, Any] = {"messages": shaped, "bos_token": self._bos_token, "eos_token": self._eos_token}
        template_tools_ = template_tools(tools)
        if template_tools_ is not None:
            variables["tools"] = template_tools_
        thinking = self.reasons if enable_thinking is None else enable_thinking
        variables.update(template_variables(options, thinking, now))
        variables.update(add_generation_prompt=generation_prompt, strftime_now=_strftime(now))
        try:
            text = self._template.render(**variables)
        except RENDER_ERRORS as error:
            raise ValueError(f"{self._description} failed: {error}") from None
        # Templates often begin with {{ bos_token }}; the tokenizer adds BOS itself where the
        # model wants one, so keeping it would give the prompt two (and the same for EOS).
        if self._add_bos and self._bos_token and text.startswith(self._bos_token):
            text = text[len(self._bos_token):]
        if self._add_eos and self._eos_token and text.endswith(self._eos_token):
            text = text[:-len(self._eos_token)]
        return text
