"""Constrained output: a request's JSON schema or GBNF grammar as a token matcher (llguidance).

A request's constraint is compiled once, when the request becomes a sequence, into an
llguidance matcher over the model's vocabulary. Each step the matchers of the constrained rows
fill one bitmask each (one bit per token: may this token come next?), computed in parallel by
llguidance; the sampler uses them to sample exactly from the allowed tokens, and each accepted
token advances the matcher. A constraint that cannot be compiled is the request's error, so a
request never runs unconstrained when it asked for a constraint.

The matcher's tokenizer is llguidance's view of the vocabulary, built once per model by the
backend (the llama.cpp one from its vocab; a test backend from its byte pieces).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Sequence

import llguidance
import llguidance.numpy
import numpy as np

from .config import SamplingParams
from .errors import first_line

_BITS = 32  # tokens per bitmask word
# Whitespace between JSON tokens, as llama.cpp's JSON-schema grammars allow it: one space, or
# one or two newlines and an indent of up to 20. JSON itself allows any run of whitespace, and
# small models then tend to write whitespace until max_tokens instead of finishing.
_JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}
_executor: llguidance.LLExecutor | None = None
_executor_lock = threading.Lock()
# Batch files repeat one schema on thousands of lines: each distinct constraint is compiled
# once per vocabulary and every request gets a copy of that matcher (a copy costs about a
# microsecond, a compile about half a millisecond).
_CACHED_CONSTRAINTS = 64
# Each entry holds its tokenizer too, so that no other tokenizer can reuse its id meanwhile.
_compiled: dict[tuple[int, str], tuple[llguidance.LLTokenizer, llguidance.LLMatcher]] = {}
_compiled_lock = threading.Lock()


class ConstraintError(ValueError):
    """A schema or grammar that cannot be compiled, or output the matcher refused."""


def grammar_definition(params: SamplingParams) -> str | None:
    """The llguidance grammar for a request's constraint (None when it has none).
    Raises ConstraintError when the text cannot even be translated (bad GBNF syntax)."""
    if params.json_schema is not None:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(params.json_schema), defaults=_JSON_OPTIONS)
    if params.json_object:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps({"type": "object"}), defaults=_JSON_OPTIONS)
    if params.grammar is not None:
        try:
            return llguidance.grammar_from("gbnf", params.grammar)
        except ValueError as error:
            raise ConstraintError(f"grammar cannot be compiled: {first_line(error)}") from None
    return None


def check_constraint(params: SamplingParams) -> None:
    """Compile a request's constraint without a vocabulary: raises ConstraintError naming the
    field when the schema or grammar is invalid (so input files can be checked before a run)."""
    definition = grammar_definition(params)
    if definition is not None:
        error = _validation_error(definition)
        if error is not None:
            raise ConstraintError(f"{_field_name(params)} cannot be compiled: {error}")


@functools.lru_cache(maxsize=_CACHED_CONSTRAINTS)
def _validation_error(definition: str) -> str | None:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(definition)
    return first_line(messages[0]) if is_error else None


def _field_name(params: SamplingParams) -> str:
    return "json_schema" if params.json_schema is not None else "grammar" if params.grammar is not None else "json_object"


def tokenizer_from_pieces(pieces: Sequence[bytes], end_tokens: Sequence[int], special_tokens: Sequence[int],
                          encode: Callable[[bytes], list[int]]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for a vocabulary given as the bytes of each token (special tokens
    marked with a leading 0xff, as llguidance expects), its end tokens and an encoder."""

    class _Vocabulary:
        eos_token_id = end_tokens[0]
        bos_token_id = None
        tokens = list(pieces)
        special_token_ids = list(special_tokens)

        def __call__(self, text: bytes | str) -> list[int]:
            return encode(text.encode("utf-8") if isinstance(text, str) else text)

    wrapper = llguidance.TokenizerWrapper(_Vocabulary())
    return llguidance.LLTokenizer(wrapper, n_vocab=len(pieces), eos_token=list(end_tokens))


class TokenConstraint:
    """One sequence's compiled constraint: which tokens may come next, advanced token by token."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, params: SamplingParams) -> None:
        definition = grammar_definition(params)
        assert definition is not None, "only a constrained request gets a TokenConstraint"
        compiled = _compiled_matcher(tokenizer, definition)
        if compiled.is_error():
            raise ConstraintError(f"{_field_name(params)} cannot be compiled: {first_line(compiled.get_error())}")
        self.matcher = compiled.deep_copy()
        self.vocab_size = tokenizer.vocab_size

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ConstraintError(f"the constraint refused token {token}: {first_line(self.matcher.get_error())}")

    @property
    def is_complete(self) -> bool:
        """The output is a whole document and nothing may follow it but the end."""
        return self.matcher.is_stopped() and not self.matcher.is_error()


def _compiled_matcher(tokenizer: llguidance.LLTokenizer, definition: str) -> llguidance.LLMatcher:
    """The matcher of a definition in its initial state, compiled once (never advanced: each
    request advances its own copy)."""
    key = (id(tokenizer), definition)
    with _compiled_lock:
        entry = _compiled.get(key)
        if entry is None:
            if len(_compiled) >= _CACHED_CONSTRAINTS:
                _compiled.pop(next(iter(_compiled)))
            entry = _compiled[key] = (tokenizer, llguidance.LLMatcher(tokenizer, definition, log_level=0))
        return entry[1]


def _shared_executor() -> llguidance.LLExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = llguidance.LLExecutor()
        return _executor


def fill_bitmasks(constraints: Sequence[TokenConstraint]) -> np.ndarray:
    """One bitmask row per constraint (bit t of row r: token t may come next for constraint r),
    computed in parallel."""
    num_words = (constraints[0].vocab_size + _BITS - 1) // _BITS
    bitmasks = np.zeros((len(constraints), num_words), dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask_par(
        _shared_executor(), [(constraint.matcher, row) for row, constraint in enumerate(constraints)], bitmasks)
    return bitmasks.view(np.uint32)


def allowed_bits(bitmask: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether each of `tokens` is allowed by one bitmask row (tokens past its end are not)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    words = tokens >> 5
    inside = words < bitmask.shape[0]
    bits = (bitmask[np.minimum(words, bitmask.shape[0] - 1)] >> (tokens & 31).astype(np.uint32)) & 1
    return (bits == 1) & inside


def num_allowed(bitmask: np.ndarray) -> int:
    return int(np.bitwise_count(bitmask).sum())


def allowed_tokens(bitmask: np.ndarray) -> np.ndarray:
    """The ids a bitmask row allows, ascending; only the non-zero words are unpacked."""
    words = np.flatnonzero(bitmask)
    bits = np.unpackbits(bitmask[words].view(np.uint8).reshape(len(words), 4), axis=1, bitorder="little")
    ids = words[:, None] * _BITS + np.arange(_BITS)[None, :]
    return ids[bits.astype(bool)]


def allowed_row(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """A bitmask row unpacked to one bool per token of a vocab_size-wide logits row."""
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little").astype(bool)
    if bits.shape[0] >= vocab_size:
        return bits[:vocab_size]
    return np.concatenate([bits, np.zeros(vocab_size - bits.shape[0], dtype=bool)])
