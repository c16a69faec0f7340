"""A model's text side: tokens to text and back, its end-of-generation tokens, llguidance's
tokenizer over its vocabulary (`Vocabulary`), and its chat template rendered (`render_chat`).

Imports nothing of llama_cpp: Vocabulary and `apply_builtin_template` call the library
multiseq.llama.backend (its only importer) hands them; render_chat works on plain values and the
functions it is given.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .chat_template import ChatTemplate, JinjaRenderer, load_chat_template
from .media import is_placeholder
from .template_input import content_text
from ..errors import BackendError

_PIECE_BUFFER_BYTES = 256


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens (None where it has none): the prefix, suffix
    and middle markers, and the repository-level ones (the repository name, a file's start)."""

    prefix: int | None = None
    suffix: int | None = None
    middle: int | None = None
    repository: int | None = None
    file_separator: int | None = None

    @property
    def missing(self) -> list[str]:
        """The markers infilling needs that the vocabulary lacks."""
        return [name for name in ("prefix", "suffix", "middle") if getattr(self, name) is None]


def _token_or_none(found: int) -> int | None:
    """A token llama.cpp looked up (LLAMA_TOKEN_NULL, -1, where the vocabulary has none)."""
    return found if found >= 0 else None


class Vocabulary:
    """A loaded model's vocabulary (llama_vocab), for tokenizing and detokenizing."""

    def __init__(self, llama: ModuleType, vocab) -> None:
        self._llama = llama
        self._vocab = vocab
        self.n_vocab = llama.llama_vocab_n_tokens(vocab)
        self.add_bos = bool(llama.llama_vocab_get_add_bos(vocab))
        self.add_eos = bool(llama.llama_vocab_get_add_eos(vocab))
        self._piece_cache: dict[int, bytes] = {}
        self._end_of_generation_tokens: list[int] | None = None
        self._grammar_tokenizer = None
        self._grammar_tokenizer_lock = threading.Lock()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> tokens, with the model's BOS (unless add_special is false) and special tokens
        parsed (as llama-server does; parse_special false: their text is plain text, as a
        file's contents are)."""
        llama = self._llama
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama.llama_token * capacity)()
        count = llama.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if count < 0:
            capacity = -count
            tokens = (llama.llama_token * capacity)()
            count = llama.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if count < 0:
            raise BackendError("tokenization failed")
        return tokens[:count]

    def token_bytes(self, token: int) -> bytes:
        """The bytes a generated token stands for; special tokens render as nothing. Safe from
        any thread: each call that reaches llama.cpp writes into a buffer of its own (the call
        releases the GIL, so a shared buffer would hand one thread another's bytes), and a
        cached piece is only ever stored whole."""
        piece = self._piece_cache.get(token)
        if piece is None:
            if is_placeholder(token):  # a medium's: no text
                return b""
            piece = token_piece(self._llama, self._vocab, token, render_special=False)
            self._piece_cache[token] = piece
        return piece

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._llama.llama_vocab_is_eog(self._vocab, token))

    def end_of_generation_tokens(self) -> list[int]:
        """Every end-of-generation token (EOS, EOT, ...): what ignore_eos forbids sampling."""
        if self._end_of_generation_tokens is None:
            self._end_of_generation_tokens = [
                token for token in range(self.n_vocab) if self._llama.llama_vocab_is_eog(self._vocab, token)]
        return self._end_of_generation_tokens

    def grammar_tokenizer(self):
        """llguidance's tokenizer over this vocabulary, for constrained requests: built at the
        first one (1.2 s on a 262k vocabulary, 0.3 s on a 49k one), then shared by every runner
        on the model. Every end-of-generation token ends a constrained document, as it ends
        generation."""
        with self._grammar_tokenizer_lock:
            if self._grammar_tokenizer is None:
                from llguidance import LLTokenizer

                tokenize = ctypes.cast(self._llama.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
                self._grammar_tokenizer = LLTokenizer.from_llamacpp(
                    tokens=grammar_pieces(self._llama, self._vocab, self.n_vocab), vocab_ptr=self._vocab,
                    tokenize_fptr=tokenize, eos_token=self.end_of_generation_tokens(), slices=None)
            return self._grammar_tokenizer

    def fim_tokens(self) -> FimTokens:
        """The fill-in-the-middle tokens, as llama.cpp found them (in the GGUF's metadata, or by
        their texts in the vocabulary)."""
        llama, vocab = self._llama, self._vocab
        return FimTokens(*(_token_or_none(find(vocab)) for find in (
            llama.llama_vocab_fim_pre, llama.llama_vocab_fim_suf, llama.llama_vocab_fim_mid,
            llama.llama_vocab_fim_rep, llama.llama_vocab_fim_sep)))

    @property
    def bos(self) -> int | None:
        return _token_or_none(self._llama.llama_vocab_bos(self._vocab))

    def render(self, tokens: list[int]) -> str:
        """Tokens as text with special tokens written out: how llama-server shows a prompt."""
        llama = self._llama
        array = (llama.llama_token * max(len(tokens), 1))(*tokens)
        capacity = 16 * len(tokens) + 64
        for _ in range(2):
            buffer = ctypes.create_string_buffer(capacity)
            length = llama.llama_detokenize(self._vocab, array, len(tokens), buffer, capacity, False, True)
            if length >= 0:
                return buffer.raw[:length].decode("utf-8", "replace")
            capacity = -length
        raise BackendError("detokenization failed")

    def bos_and_eos_texts(self) -> tuple[str, str]:
        """The BOS and EOS tokens' texts, as templates write them ("" for none)."""
        return (self._special_text(self._llama.llama_vocab_bos(self._vocab)),
                self._special_text(self._llama.llama_vocab_eos(self._vocab)))

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        return token_piece(self._llama, self._vocab, token, render_special=True).decode("utf-8", "replace")


class GrammarTokenizers:
    """llguidance's tokenizer of each model file, built once per process and kept across the
    model's unloads and loads. Built over a vocabulary-only copy of the model that this cache
    keeps (the tokenizer calls llama_tokenize on the vocabulary it was built over, which must
    outlive it; a loaded model's own is freed when it unloads): 8 MB for a 49k vocabulary, 42 MB
    for a 262k one. The build holds the GIL (780 ms in one piece on Gemma 3's 262k tokens), so a
    server prepares a model's before its load, while nothing streams (ModelLoader). A vocabulary
    llguidance cannot read is remembered, and its ValueError raised again at each call."""

    def __init__(self, open_vocabulary_only: Callable[[str], Any]) -> None:
        self._open = open_vocabulary_only  # a model file -> its vocabulary-only model (kept open)
        self._built: dict[tuple, tuple[Any, Any]] = {}  # file identity -> (that model, tokenizer or ValueError)
        self._lock = threading.Lock()

    def of(self, model_path: str) -> Any:
        key = _file_identity(model_path)
        with self._lock:
            if key not in self._built:
                vocabulary_model = self._open(model_path)
                try:
                    built = vocabulary_model.grammar_tokenizer()
                except ValueError as error:
                    built = error
                self._built[key] = (vocabulary_model, built)
            built = self._built[key][1]
        if isinstance(built, ValueError):
            raise built
        return built

    def has(self, model_path: str) -> bool:
        with self._lock:
            return _file_identity(model_path) in self._built


def _file_identity(path: str) -> tuple:
    """What tells a model file from another, and from itself rewritten."""
    found = os.stat(path)
    return os.path.realpath(path), found.st_size, found.st_mtime_ns


def token_piece(llama: ModuleType, vocab, token: int, render_special: bool) -> bytes:
    """llama.cpp's text of one token, in a buffer of this call's own (grown when too small)."""
    buffer = ctypes.create_string_buffer(_PIECE_BUFFER_BYTES)
    length = llama.llama_token_to_piece(vocab, token, buffer, _PIECE_BUFFER_BYTES, 0, render_special)
    if length < 0:
        buffer = ctypes.create_string_buffer(-length)
        length = llama.llama_token_to_piece(vocab, token, buffer, -length, 0, render_special)
    return buffer.raw[:max(length, 0)]


def grammar_pieces(llama: ModuleType, vocab, n_vocab: int) -> list[bytes]:
    """Each token's bytes as llguidance's adapter for llama.cpp (llguidance.llamacpp) gives
    them to its tokenizer: special tokens rendered, and a control token, or a user-defined one
    written like one (<...>), marked with a leading 0xff. The adapter's own loop reads a
    token's attributes through a deprecated llama.cpp name, whose warning is raised and
    filtered once per token (and silencing it changes the process's warning filters while
    other threads run): this loop takes 0.4 s on a 262k vocabulary, the adapter's 0.6 s."""
    control, user_defined = llama.LLAMA_TOKEN_ATTR_CONTROL, llama.LLAMA_TOKEN_ATTR_USER_DEFINED
    pieces = []
    for token in range(n_vocab):
        piece = token_piece(llama, vocab, token, render_special=True)
        attributes = llama.llama_vocab_get_attr(vocab, token)
        if attributes & control or (attributes & user_defined and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        pieces.append(piece)
    return pieces


def apply_builtin_template(llama: ModuleType, name: str, messages: tuple[dict, ...]) -> str | None:
    """llama.cpp's rendering with a built-in template; None when it does not know `name`."""
    encoded = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
    chat = (llama.llama_chat_message * len(encoded))(
        *(llama.llama_chat_message(role=role, content=content) for role, content in encoded))
    template = name.encode("utf-8")
    capacity = 2 * sum(len(role) + len(content) for role, content in encoded) + 256
    for _attempt in range(2):
        buffer = ctypes.create_string_buffer(capacity)
        length = llama.llama_chat_apply_template(template, chat, len(encoded), True, buffer, capacity)
        if length < 0:
            return None
        if length <= capacity:
            return buffer.raw[:length].decode("utf-8", "replace")
        capacity = length
    raise BackendError("the chat template output kept growing")


def load_user_template(value: str, builtin_names: Collection[str]) -> ChatTemplate:
    """A chat template the user gave (a built-in name, Jinja text or a file), or BackendError."""
    try:
        return load_chat_template(value, builtin_names)
    except ValueError as error:
        raise BackendError(str(error)) from None


def render_chat(template: ChatTemplate | None, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None,
                options: dict | None, apply_builtin: Callable[[str, tuple[dict, ...]], str | None],
                jinja_renderer: Callable[[ChatTemplate], JinjaRenderer], **shaping: Any) -> str:
    """Chat messages -> prompt text in a model's chat template (see LlamaModel.render_chat): the
    Jinja template's own rendering (`jinja_renderer`, with what JinjaRenderer.render takes as
    `shaping`), or, for a llama.cpp built-in template (a name, or a GGUF template jinja2 cannot
    compile), llama.cpp's rendering (`apply_builtin`)."""
    if template is None:
        raise BackendError("this model has no chat template; give a prompt instead of messages, or a chat "
                           "template (RunnerConfig.chat_template, batch-run --chat-template)")
    if template.jinja_source is not None:
        try:
            return jinja_renderer(template).render(messages, tools, options, **shaping)
        except ValueError as error:
            raise BackendError(str(error)) from None
    text = apply_builtin(template.llama_name, builtin_messages(messages))
    if text is None:
        raise BackendError(f"llama.cpp does not support the chat template {template.llama_name[:40]!r}")
    return text


def builtin_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[dict, ...]:
    """Messages as llama.cpp's built-in templates take them: a role they know and text."""
    return tuple({"role": "system" if message["role"] == "developer" else message["role"],
                  "content": content_text(message.get("content"))} for message in messages)
