"""Constrained output: a request's JSON schema or GBNF grammar as a token matcher (llguidance).

A request's constraint is compiled when the request becomes a sequence, into an llguidance
matcher over the model's vocabulary. Each step the matchers of the constrained rows fill one
bitmask each (one bit per token: may this token come next?), computed in parallel by
llguidance; the sampler uses them to sample exactly from the allowed tokens, and each accepted
token advances the matcher. A constraint that cannot be compiled is the request's error, so a
request never runs unconstrained when it asked for a constraint. A JSON schema is translated
exactly or approximated (multiseq.sampling.schema), and a schema's outputs are validated when they end.

Compiling has two stages, each done once per distinct constraint and cached: translating the
request's schema or grammar into llguidance's grammar (no vocabulary needed, so input files
are checked with it before a run), and building the matcher of that grammar over a vocabulary.
Batch files repeat one schema on thousands of lines: each line then costs a cache lookup and a
copy of the matcher (about a microsecond). Each stage runs on a thread of its own and is waited
for at most COMPILE_TIMEOUT_S: a constraint that takes longer is that request's error (and
stays one: the same constraint is not tried again), and the run goes on.

The matcher's tokenizer is llguidance's view of the vocabulary, built once per model by the
backend (the llama.cpp one from its vocab; a test backend from its byte pieces).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

from ..config import SamplingParams
from ..errors import ConstraintError, first_line
from .schema import Translation, schema_grammar
from .schema_check import SchemaCheck

__all__ = ["COMPILE_TIMEOUT_S", "ConstraintError", "TokenConstraint", "check_constraint", "translate"]

_BITS = 32  # tokens per bitmask word
# Longest wait for one stage of compiling a constraint; real schemas take milliseconds, the
# largest of JSONSchemaBench's about a second.
COMPILE_TIMEOUT_S = 10.0
_CACHED_TRANSLATIONS = 256
_CACHED_MATCHERS = 64
_executor: llguidance.LLExecutor | None = None
_executor_lock = threading.Lock()


class _Compilation:
    """One compile, run on a thread of its own so that waiting for it can be bounded. It keeps
    its outcome (a value, or the message of a ConstraintError) for every later request of the
    same constraint. Whether it was in time is measured from its start, so every request of
    the same constraint gets the same answer, even one that comes after a late finish."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._finished = threading.Event()
        self._value: Any = None
        self._error: str | None = None
        self._started = time.monotonic()
        self._seconds: float | None = None  # how long it took, once it is done
        threading.Thread(target=self._run, args=(work,), name="multiseq-compile", daemon=True).start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self._value = work()
        except ConstraintError as error:
            self._error = str(error)
        except Exception as error:  # noqa: BLE001 - llguidance failing on a constraint is that constraint's error
            self._error = f"cannot be compiled: {first_line(error)}"
        finally:
            self._seconds = time.monotonic() - self._started
            self._finished.set()

    def result(self, what: str) -> Any:
        """The compiled value; ConstraintError (naming `what`, the request's field) when the
        compile failed, or did not finish within COMPILE_TIMEOUT_S of its start."""
        self._finished.wait(max(0.0, self._started + COMPILE_TIMEOUT_S - time.monotonic()))
        if not self._finished.is_set() or self._seconds > COMPILE_TIMEOUT_S:
            raise ConstraintError(f"{what} took longer than {COMPILE_TIMEOUT_S:g} s to compile")
        if self._error is not None:
            raise ConstraintError(self._error if self._error.startswith(what) else f"{what} {self._error}")
        return self._value


class _CompileCache:
    """The compilations of the most recently used constraints (least recently used go first)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, _Compilation] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, work: Callable[[], Any]) -> _Compilation:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Compilation(work)
                if len(self._entries) > self._size:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
            return entry


_translations = _CompileCache(_CACHED_TRANSLATIONS)
# Keyed by the tokenizer's id; each matcher entry holds its tokenizer too (the matcher refers
# to it), so that no other tokenizer can reuse that id meanwhile.
_matchers = _CompileCache(_CACHED_MATCHERS)


def _field_name(params: SamplingParams) -> str:
    return "json_schema" if params.json_schema is not None else "grammar" if params.grammar is not None else "json_object"


def translate(params: SamplingParams) -> Translation | None:
    """The llguidance grammar of a request's constraint (None when it has none), translated
    once per distinct constraint. Raises ConstraintError naming the field when it cannot be
    compiled, or not within COMPILE_TIMEOUT_S."""
    if params.json_schema is not None:
        try:
            text = json.dumps(params.json_schema, allow_nan=False)
        except (ValueError, TypeError, RecursionError) as error:
            raise ConstraintError(f"json_schema cannot be compiled: it is not JSON ({first_line(error)})") from None
        key: tuple = ("json_schema", params.strict_schema, text)
        work = functools.partial(schema_grammar, params.json_schema, params.strict_schema)
    elif params.json_object:
        key, work = ("json_object",), functools.partial(schema_grammar, {"type": "object"}, True)
    elif params.grammar is not None:
        key = ("grammar", params.grammar)
        work = functools.partial(_translate_text, "gbnf", "grammar", params.grammar)
    else:
        return None
    return _translations.get(key, work).result(_field_name(params))


def translate_tool_grammar(grammar: str) -> Translation:
    """A tool-call grammar (multiseq.tools.grammars' Lark text), validated once per distinct text:
    agents send the same tools every turn, so the compile is paid once."""
    work = functools.partial(_translate_text, "lark", "tools", grammar)
    return _translations.get(("tools", grammar), work).result("tools")


def _translate_text(syntax: str, field: str, text: str) -> Translation:
    """A grammar given as text (llama.cpp's GBNF for `grammar`, Lark for `tools`), validated;
    ConstraintError names the field when llguidance refuses it."""
    try:
        grammar = llguidance.grammar_from(syntax, text)
    except ValueError as error:
        raise ConstraintError(f"{field} cannot be compiled: {first_line(error)}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"{field} cannot be compiled: {first_line(messages[0])}")
    return Translation(grammar)


def check_constraint(params: SamplingParams) -> Translation | None:
    """Translate a request's constraint without a vocabulary: raises ConstraintError naming the
    field when the schema or grammar is invalid (so input files can be checked before a run)."""
    return translate(params)


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
    """One sequence's compiled constraint: which tokens may come next, advanced token by token;
    for a JSON schema, what its grammar approximates and the check of the finished output."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, params: SamplingParams,
                 tool_grammar: str | None = None) -> None:
        """The request's schema or grammar, or (`tool_grammar`) the grammar of its tool calls."""
        translation = translate_tool_grammar(tool_grammar) if tool_grammar is not None else translate(params)
        assert translation is not None, "only a constrained request gets a TokenConstraint"
        what = "tools" if tool_grammar is not None else _field_name(params)
        compiled = _matchers.get((id(tokenizer), translation.grammar),
                                 lambda: (tokenizer, _build_matcher(tokenizer, translation.grammar)))
        matcher = compiled.result(what)[1]
        if matcher.is_error():
            raise ConstraintError(f"{what} cannot be compiled: {first_line(matcher.get_error())}")
        self.matcher = matcher.deep_copy()  # the cached matcher stays in its initial state
        self.vocab_size = tokenizer.vocab_size
        self.approximated = translation.approximated
        self._check = None if params.json_schema is None or tool_grammar else _schema_check(params.json_schema)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ConstraintError(f"the constraint refused token {token}: {first_line(self.matcher.get_error())}")

    def rollback(self, num_tokens: int) -> None:
        """Take back the last num_tokens accepted tokens (a draft's rows were sampled ahead)."""
        if not self.matcher.rollback(num_tokens):
            raise ConstraintError(f"the constraint could not take back {num_tokens} tokens: "
                                  f"{first_line(self.matcher.get_error())}")

    @property
    def is_complete(self) -> bool:
        """The output is a whole document and nothing may follow it but the end."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def output_error(self, text: str) -> str | None:
        """Why an output that ended is not valid under the request's JSON schema (None when it
        is, or when the constraint is no schema: a grammar's output is exactly its language)."""
        return None if self._check is None else self._check.error(text)


def _build_matcher(tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    """The matcher of a grammar in its initial state (never advanced: each request advances
    its own copy)."""
    return llguidance.LLMatcher(tokenizer, grammar, log_level=0)


_checks: OrderedDict[str, SchemaCheck] = OrderedDict()
_checks_lock = threading.Lock()


def _schema_check(schema: dict[str, Any]) -> SchemaCheck:
    """The validator of a schema, built once per distinct schema (by its JSON text)."""
    key = json.dumps(schema)
    with _checks_lock:
        check = _checks.get(key)
        if check is None:
            check = _checks[key] = SchemaCheck(schema)
            if len(_checks) > _CACHED_TRANSLATIONS:
                _checks.popitem(last=False)
        else:
            _checks.move_to_end(key)
        return check


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
