"""Fill-in-the-middle prompts as llama-server's /infill builds them, for editors written against
it (llama.vscode, llama.vim): the text before the cursor, the text after it, and chunks of other
files, laid out with the vocabulary's FIM tokens in the repository-level pattern
(https://arxiv.org/pdf/2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n chunk 0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt

(a model without the repository tokens gets its chunks after a "--- snippet ---" line each).
The same request builds the same tokens as llama-server's does, from the same window sizes:
the prefix keeps its last 3/4 of a batch, the suffix its first 1/4 less the prompt, and the
chunks fill what the context has left after a batch, newest text last.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..llama.text import FimTokens
from .fields import ItemError

_REPOSITORY_LINE = "myproject\n"  # llama-server's name for the repository (it takes none)
_CURRENT_FILE_LINE = "filename\n"  # and for the file being edited
_CHUNK_HEADER = "\n\n--- snippet ---\n\n"  # a chunk's start, for models without a file separator
FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt")


@dataclass(frozen=True)
class ExtraChunk:
    """A piece of another file the editor thinks relevant."""

    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class InfillInput:
    """An /infill request's text: around the cursor, other files, and text after the cursor's
    start that the completion must begin with (`prompt`)."""

    prefix: str | list[str | int]
    suffix: str | list[str | int]
    extra: tuple[ExtraChunk, ...] = ()
    prompt: str = ""


@dataclass(frozen=True)
class InfillWindow:
    """The sizes llama-server's layout takes its cuts from."""

    n_batch: int  # the logical batch: the prefix and suffix together fit in one
    n_ctx: int  # the slot's context
    n_predict: int = -1  # the server's own limit on output (-1: none), not the request's


def infill_input(body: dict[str, Any]) -> InfillInput:
    """The /infill fields of a request body; ItemError naming the field that is wrong."""
    for required in ("input_prefix", "input_suffix"):
        if required not in body:
            raise ItemError(f"{required!r} is required: the text {'before' if 'prefix' in required else 'after'} "
                            "the cursor (may be empty)", required)
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise ItemError("'prompt' must be a string: text the middle starts with", "prompt")
    return InfillInput(_mixed(body["input_prefix"], "input_prefix"), _mixed(body["input_suffix"], "input_suffix"),
                       _chunks(body.get("input_extra")), prompt)


def _mixed(value: Any, field: str) -> str | list[str | int]:
    """A text, or a list of texts and token ids (llama-server's mixed prompt)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool))
                                       for item in value):
        return value
    raise ItemError(f"{field!r} must be a string (or a list of strings and token ids), got {json.dumps(value)[:80]}",
                    field)


def _chunks(value: Any) -> tuple[ExtraChunk, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ItemError("'input_extra' must be an array of {\"filename\": string, \"text\": string}", "input_extra")
    chunks = []
    for index, chunk in enumerate(value):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ItemError(f"input_extra[{index}] must be an object with a \"text\" string", "input_extra")
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise ItemError(f"input_extra[{index}].filename must be a string", "input_extra")
        chunks.append(ExtraChunk(chunk["text"], filename))
    return tuple(chunks)


def infill_tokens(request: InfillInput, fim: FimTokens, tokenize_text: Callable[[str], list[int]],
                  prompt_tokens: list[int], window: InfillWindow, bos: int | None) -> list[int]:
    """The prompt's tokens, laid out as llama-server's format_prompt_infill lays them (its
    suffix-first variant, --spm-infill, aside). `tokenize_text` tokenizes a file's text as
    plain text (no BOS, special tokens' texts not parsed); `prompt_tokens` are the request's
    prompt's (special tokens parsed); `bos` is given where the vocabulary adds one."""
    assert not fim.missing, "the caller checks that the model has FIM tokens"
    prefix = _tokens(request.prefix, tokenize_text)
    suffix = _tokens(request.suffix, tokenize_text)
    extra = _extra_tokens(request.extra, fim, tokenize_text)
    prefix_take = min(len(prefix), 3 * (window.n_batch // 4))
    suffix_take = min(len(suffix), max(0, window.n_batch // 4 - (2 + len(prompt_tokens))))
    extra_take = min(max(0, window.n_ctx - window.n_batch - 2 * window.n_predict), len(extra))
    before = [fim.prefix, *prefix[len(prefix) - prefix_take:], *prompt_tokens]
    after = [fim.suffix, *suffix[:suffix_take]]
    start = [bos] if bos is not None else []
    return [*extra[len(extra) - extra_take:], *start, *before, *after, fim.middle]


def _tokens(value: str | list[str | int], tokenize_text: Callable[[str], list[int]]) -> list[int]:
    if isinstance(value, str):
        return tokenize_text(value)
    tokens: list[int] = []
    for item in value:
        tokens.extend(tokenize_text(item) if isinstance(item, str) else [item])
    return tokens


def _extra_tokens(chunks: tuple[ExtraChunk, ...], fim: FimTokens,
                  tokenize_text: Callable[[str], list[int]]) -> list[int]:
    """The other files' chunks, each after its file's name (or a snippet line), under the
    repository's name, and the current file's name last."""
    tokens = [fim.repository, *tokenize_text(_REPOSITORY_LINE)] if fim.repository is not None else []
    for chunk in chunks:
        if fim.file_separator is not None:
            tokens += [fim.file_separator, *tokenize_text(chunk.filename + "\n")]
        else:
            tokens += tokenize_text(_CHUNK_HEADER)
        tokens += tokenize_text(chunk.text)
    if fim.file_separator is not None:
        tokens += [fim.file_separator, *tokenize_text(_CURRENT_FILE_LINE)]
    return tokens
