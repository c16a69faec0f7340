"""Chat templates: a llama.cpp built-in template name, or a Jinja template (text or a file).

llama.cpp's llama_chat_apply_template knows only its built-in templates, which it recognises
by name or by substrings of a template's text; it cannot run an arbitrary Jinja template. A
Jinja template given by the user is therefore rendered here with jinja2, in a sandbox, with
the variables Hugging Face chat templates expect: messages, add_generation_prompt (always
true: the prompt ends where the model speaks), bos_token and eos_token.

This module does not import llama_cpp: the backend hands it the built-in names and the BOS
and EOS texts.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

_JINJA_MARKERS = ("{{", "{%")
_TEMPLATE_FILE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".tmpl", ".txt")


@dataclass(frozen=True)
class ChatTemplate:
    """How chat messages become a prompt. `llama_name` is handed to llama.cpp (a built-in name,
    or a template text it may recognise); `jinja_source` is rendered with jinja2, first when
    llama_name is None, else only where llama.cpp does not recognise llama_name."""

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
        """The GGUF's own template: llama.cpp's built-in when it recognises it, else jinja2."""
        return cls(source, source, "the model's chat template")


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


def _strftime_now(date_format: str) -> str:
    return datetime.datetime.now().strftime(date_format)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    """Hugging Face's tojson: json.dumps with keys in their order and no HTML escaping (jinja2's
    own sorts keys and escapes <, > and &, so a re-rendered tool call would not match the text
    the model generated)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_jinja(source: str, description: str) -> jinja2.Template:
    """Compile a chat template in a sandbox; ValueError names the line of a syntax error."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    environment.filters["tojson"] = _tojson
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"{description} does not compile: line {error.lineno}: {error.message}") from None


class JinjaRenderer:
    """A compiled Jinja chat template with the model's BOS and EOS texts."""

    def __init__(self, source: str, description: str, bos_token: str, eos_token: str, add_bos: bool) -> None:
        self._template = compile_jinja(source, description)
        self._description = description
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._add_bos = add_bos

    def render(self, messages: tuple[dict, ...], tools: list[dict] | None = None, options: dict | None = None) -> str:
        """The prompt text; ValueError when the template fails or refuses the messages."""
        extra = dict(options or {}) | ({} if tools is None else {"tools": tools})
        try:
            text = self._template.render(messages=[dict(message) for message in messages], add_generation_prompt=True,
                                         bos_token=self._bos_token, eos_token=self._eos_token, **extra)
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as error:
            raise ValueError(f"{self._description} failed: {error}") from None
        # Templates often begin with {{ bos_token }}; the tokenizer adds BOS itself where the
        # model wants one, so keeping it would give the prompt two.
        if self._add_bos and self._bos_token and text.startswith(self._bos_token):
            text = text[len(self._bos_token):]
        return text
