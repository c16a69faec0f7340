"""The Sequence: all of one request's state while it waits, prefills and decodes in a slot.

Its methods are the only code that changes that state; the scheduler moves sequences between
the queue and the slots, and the engine calls these methods with what each step produced.

The life of a sequence, and every reason it ends, are here:

    waiting ──admit──> prefilling ──last prompt token decoded──> decoding ──ending──> finished
       ^                   │                                      │  ^
       └─ requeue (no room ┘          parked <── preempt ─────────┘  │
          in a full pool)               │      (its KV to RAM)       │
                                        └── resume (its KV restored) ┘
    waiting, prefilling, decoding, parked ──cancel──> cancelled
                                          ──failure─> failed (a bad token, a failed decode)

A sequence decides *that* it ends (`ending`: a stop token or string, max_tokens, a full window
that cannot slide, a cancel, a failure) in the method that learns it; the engine retires every
sequence with an ending at the next step boundary, in one place (Engine._retire), and finish()
makes the move to the final status. An output that ended by itself under a JSON schema is
validated there, against the whole schema (the grammar may have approximated some of it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from ..config import OverflowPolicy, SamplingParams
from ..llama.media import PromptMedia
from .pieces import OutputPieces
from ..errors import RequestFault
from ..request import FinishReason, Priority
from ..sampling.logprobs import TokenLogprob
from ..sampling.sampler import Sampled, SequenceSampler

if TYPE_CHECKING:
    from ..kv.hostcache import HostEntry
    from .pooling import PooledEmbedding
    from ..tools.reader import OutputParser

CANCELLED_BEFORE_START = "Cancelled: the request was cancelled before it started"


class SequenceStatus(Enum):
    WAITING = "waiting"
    PARKED = "parked"  # preempted: its KV parked in host memory, waiting for a slot to resume in
    PREFILLING = "prefill"
    DECODING = "decode"
    FINISHED = "finished"  # ended by itself: a stop token or string, max_tokens, a full window
    CANCELLED = "cancelled"
    FAILED = "failed"


# Every move a sequence may make, from each status; the final ones lead nowhere.
_NEXT_STATUSES = {
    SequenceStatus.WAITING: {SequenceStatus.PREFILLING, SequenceStatus.CANCELLED, SequenceStatus.FAILED},
    SequenceStatus.PARKED: {SequenceStatus.DECODING, SequenceStatus.CANCELLED, SequenceStatus.FAILED},
    SequenceStatus.PREFILLING: {SequenceStatus.DECODING, SequenceStatus.WAITING, SequenceStatus.CANCELLED,
                                SequenceStatus.FAILED},
    SequenceStatus.DECODING: {SequenceStatus.FINISHED, SequenceStatus.PARKED, SequenceStatus.CANCELLED,
                              SequenceStatus.FAILED},
    SequenceStatus.FINISHED: set(),
    SequenceStatus.CANCELLED: set(),
    SequenceStatus.FAILED: set(),
}
_FINAL_STATUS = {FinishReason.STOP: SequenceStatus.FINISHED, FinishReason.LENGTH: SequenceStatus.FINISHED,
                 FinishReason.CANCELLED: SequenceStatus.CANCELLED, FinishReason.ERROR: SequenceStatus.FAILED}


class InvalidTransition(AssertionError):
    """A move the life of a sequence does not allow: a bug in the engine, never bad input."""


@dataclass(frozen=True)
class Ending:
    """Why a sequence ends, decided when it became so; applied at the next step boundary."""

    reason: FinishReason
    error: str | None = None


class Sequence:
    """One request in the engine: its prompt, its slot's KV accounting, its output so far."""

    def __init__(self, request_id: str, prompt_tokens: list[int], sampler: SequenceSampler, n_keep: int,
                 overflow: OverflowPolicy, max_tokens: int, prompt_tokens_dropped: int = 0,
                 submitted_at: float | None = None, priority: int = Priority.BATCH,
                 tool_parser: OutputParser | None = None, embedding: PooledEmbedding | None = None,
                 media_spans: tuple = (), streams: bool = False, adapter: int = 0) -> None:
        self.id = request_id
        self.adapter = adapter  # the runner's adapter set its steps run through (0: the model's own)
        self.embedding = embedding  # an embedding request's rows, pooled: it ends with its prompt
        self.priority = priority
        self.prompt_tokens = prompt_tokens
        self.media = PromptMedia(media_spans, len(prompt_tokens))  # where images stand: each computed whole
        self.streams = streams  # its pieces are watched as they come (a stream, not a batch line)
        self.sampler = sampler
        self.n_keep = n_keep
        self.overflow = overflow
        self.max_tokens = max_tokens  # the request's, or what its window leaves when it asked for none
        self.prompt_tokens_dropped = prompt_tokens_dropped
        self.status = SequenceStatus.WAITING
        self.ending: Ending | None = None  # set once the sequence must end; applied by finish()
        self.slot: int | None = None
        self.output_tokens: list[int] = []
        self.num_prefilled = 0  # prompt tokens in the slot's KV (reused or decoded)
        self.num_cached = 0  # prompt tokens reused from a prefix already computed (a slot's KV or host memory)
        self.num_restored = 0  # of those, how many were restored from host memory
        self.num_intact_prompt = len(prompt_tokens)  # prompt tokens still at their positions after shifts
        self.n_past = 0  # tokens in the slot's KV; the next token goes at this position
        self._prompt_array: np.ndarray | None = None
        self.tokens_shifted_out = 0
        self.num_drafted = self.num_draft_accepted = 0  # draft tokens verified for it, and kept (output)
        self.is_window_exhausted = False  # the window filled up and could not slide
        self.schema_error: str | None = None  # why the finished output does not validate
        self.submitted_at = time.perf_counter() if submitted_at is None else submitted_at
        self.admitted_at = self.prefilled_at = self.first_token_at = self.finished_at = None  # float | None
        self.parked: HostEntry | None = None  # preempted: its slot's KV, saved to resume from
        # With params.prompt_logprobs: the log probability of each prompt token after the first.
        self.prompt_logprobs: list[TokenLogprob] = []
        self.end_of_generation_logprob: TokenLogprob | None = None  # the token that ended it, with logprobs
        # Its text, the log probabilities behind it, and what it parses into (with tools).
        self.pieces = OutputPieces(tool_parser, sampler.params.logprobs, sampler.params.stop, sampler.params.min_indent)

    # --- derived state -------------------------------------------------------------------

    @property
    def params(self) -> SamplingParams:
        return self.sampler.params

    @property
    def num_prompt_remaining(self) -> int:
        return len(self.prompt_tokens) - self.num_prefilled

    @property
    def prompt_array(self) -> np.ndarray:
        """The prompt as tokens, for comparing prefixes (int64: media placeholders; adapter_marked)."""
        if self._prompt_array is None:
            self._prompt_array = adapter_marked(np.asarray(self.prompt_tokens, dtype=np.int64), self.adapter)
        return self._prompt_array

    @property
    def last_token(self) -> int:
        """The newest generated token: not yet in the KV, the next step decodes it."""
        return self.output_tokens[-1]

    @property
    def is_waiting(self) -> bool:
        """In the queue: new, sent back to it, or parked."""
        return self.status in (SequenceStatus.WAITING, SequenceStatus.PARKED)

    @property
    def is_running(self) -> bool:
        """In a slot: prefilling or decoding."""
        return self.status in (SequenceStatus.PREFILLING, SequenceStatus.DECODING)

    @property
    def is_done(self) -> bool:
        """Finished, cancelled or failed: nothing more happens to it."""
        return not _NEXT_STATUSES[self.status]

    @property
    def is_ending(self) -> bool:
        """It must end at the next step boundary (or is done already)."""
        return self.ending is not None

    @property
    def is_truncated(self) -> bool:
        return self.prompt_tokens_dropped > 0 or self.tokens_shifted_out > 0 or self.is_window_exhausted

    @property
    def text(self) -> str:
        return self.pieces.text

    # --- transitions -----------------------------------------------------------------------

    def _move_to(self, status: SequenceStatus) -> None:
        if status not in _NEXT_STATUSES[self.status]:
            raise InvalidTransition(f"sequence {self.id}: {self.status.value} -> {status.value} is not allowed")
        self.status = status

    def _end(self, reason: FinishReason, error: str | None = None) -> None:
        """Decide that the sequence ends; the first reason found is the one that counts."""
        if self.ending is None:
            self.ending = Ending(reason, error)

    def admit(self, slot: int, now: float, num_cached: int = 0, from_host: bool = False,
              prompt_scores: tuple[TokenLogprob, ...] = ()) -> None:
        """Waiting -> prefilling in `slot`, whose KV already holds the first num_cached prompt
        tokens (a reused prefix; from_host: restored from host memory; prompt_scores: theirs)."""
        assert 0 <= num_cached < len(self.prompt_tokens), "the last prompt token is always decoded"
        self._move_to(SequenceStatus.PREFILLING)
        self.slot = slot
        self.admitted_at = now
        self.num_cached = self.num_prefilled = self.n_past = num_cached
        self.num_restored = num_cached if from_host else 0
        self.prompt_logprobs[:] = prompt_scores

    def score_prompt(self, start: int, scores: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> None:
        """Prompt tokens' log probabilities from `start` (a prompt computed again overwrites them)."""
        self.prompt_logprobs[start:start + len(scores)] = scores

    @property
    def can_be_preempted(self) -> bool:
        """Decoding, not ending, and its KV holds its tokens at their own positions (not slid)."""
        return self.status is SequenceStatus.DECODING and self.ending is None and not self.is_truncated

    def preempt(self, parked: HostEntry) -> None:
        """Decoding -> parked: its slot goes to a request of higher priority; its KV (prompt
        and generated tokens but the newest, which the next step decodes) is parked."""
        assert self.can_be_preempted and len(parked.tokens) == self.n_past
        self._move_to(SequenceStatus.PARKED)
        self.slot = None
        self.parked = parked

    def requeue(self) -> None:
        """Prefilling -> waiting again: a shared KV pool had no room for the rest of its prompt.
        It starts over when admitted again, from whatever prefix is held then."""
        assert self.status is SequenceStatus.PREFILLING and self.ending is None
        self._move_to(SequenceStatus.WAITING)
        self.slot = None
        self.num_cached = self.num_prefilled = self.n_past = self.num_restored = 0

    def resume(self, slot: int) -> None:
        """Parked -> decoding again in `slot`, whose KV now holds what was parked, as if it never left."""
        assert self.parked is not None
        self._move_to(SequenceStatus.DECODING)
        self.slot = slot
        self.parked = None

    def drop_cached_prefix(self) -> None:
        """The reused prefix turned out not to be intact in the KV: prefill the whole prompt."""
        assert self.status is SequenceStatus.PREFILLING and self.n_past == self.num_cached
        self.num_cached = self.num_prefilled = self.n_past = self.num_restored = 0

    def record_decoded(self, num_tokens: int, is_prefill: bool, now: float) -> None:
        """A step put num_tokens of it into its slot's KV; its last prompt token starts decoding."""
        self.n_past += num_tokens
        if is_prefill:
            self.num_prefilled += num_tokens
            if self.num_prompt_remaining == 0:
                self._move_to(SequenceStatus.DECODING)
                self.prefilled_at = now
                if self.embedding is not None:  # its embedding is all it computes
                    self._end(FinishReason.STOP)

    def record_draft(self, num_drafted: int, num_kept: int) -> None:
        """A step verified num_drafted draft tokens after its newest token and num_kept of them
        came true: the others left the slot's KV."""
        self.n_past -= num_drafted - num_kept
        self.num_drafted += num_drafted
        self.num_draft_accepted += num_kept

    def record_shift(self, keep: int, discard: int) -> None:
        """The slot's KV dropped `discard` positions after `keep` and moved the rest back."""
        self.n_past -= discard
        self.tokens_shifted_out += discard
        self.num_intact_prompt = min(self.num_intact_prompt, keep)

    def append_token(self, sampled: Sampled, piece: bytes, is_end_of_generation: bool, now: float) -> str:
        """Take one sampled token; return the text it makes ready to emit. A token that ends
        the sequence (end of generation, a stop string, a complete constrained document,
        max_tokens) sets its ending."""
        assert self.status is SequenceStatus.DECODING and self.ending is None
        try:
            self.sampler.accept(sampled.token)
        except Exception as error:
            raise RequestFault("constraining its output", error) from error
        self.output_tokens.append(sampled.token)
        if self.first_token_at is None:
            self.first_token_at = now
        if is_end_of_generation and not self.params.ignore_eos:
            self.end_of_generation_logprob = sampled.logprob  # not part of the text's, but scoring reports it
            self._end(FinishReason.STOP)
            return ""
        if self.pieces.logprobs is not None and sampled.logprob is not None:
            self.pieces.logprobs.append(sampled.logprob)
        try:
            text = self.pieces.take_bytes(piece)
        except Exception as error:
            raise RequestFault("detokenizing its output", error) from error
        if self.pieces.has_reached_stop_string or self.sampler.is_constraint_complete:
            self._end(FinishReason.STOP)
        elif len(self.output_tokens) >= self.max_tokens or \
                ends_as_code_completion(self.params, self.pieces, text, now - self.first_token_at):
            self._end(FinishReason.LENGTH)
        return text

    def request_cancel(self) -> None:
        """A waiting sequence ends without running; a running one at the next step, keeping its text."""
        never_started = self.is_waiting and not self.output_tokens  # (a preempted one keeps its text)
        self._end(FinishReason.CANCELLED, CANCELLED_BEFORE_START if never_started else None)

    def fail(self, error: str, overriding: bool = False) -> None:
        """End with an error. `overriding`: even if another ending was decided first (after a
        failed step, a cancelled sequence's KV is in doubt too, and it is failed with the rest)."""
        if overriding and not self.is_done:
            self.ending = None
        self._end(FinishReason.ERROR, error)

    def exhaust_window(self) -> None:
        """The window is full and cannot slide: the sequence ends as length, truncated."""
        self.is_window_exhausted = True
        self._end(FinishReason.LENGTH)

    def finish(self, now: float) -> str:
        """Apply the ending: move to the final status; return the held text this releases.

        Held text (a possible stop-string start) is released when generation ends by itself or
        fails; never after a stop string, nor on cancel (nothing comes after cancel() returned).
        An output that stopped by itself is checked against the request's JSON schema."""
        assert self.ending is not None, "only a sequence with an ending finishes"
        reason = self.ending.reason
        releases_held_text = ((self.is_running or self.parked is not None) and reason is not FinishReason.CANCELLED
                              and not self.pieces.has_reached_stop_string)
        try:
            text = self.pieces.release_held() if releases_held_text else ""
            if reason is FinishReason.STOP:
                self.schema_error = self.sampler.output_error(self.text)
        except Exception as error:
            raise RequestFault("finishing its output", error) from error
        self._move_to(_FINAL_STATUS[reason])
        self.finished_at = now
        return text

    def fail_while_finishing(self, error: str, now: float) -> None:
        """A fault while its ending was applied or reported (a parser's close(), say): it ends
        failed, whatever ending it had and however far finish() got."""
        self.ending = Ending(FinishReason.ERROR, error)
        self.status = SequenceStatus.FAILED
        self.finished_at = self.finished_at or now


# --- what a sequence's slot holds, for others to reuse ------------------------------------------

def reusable_prompt_length(seq: Sequence) -> int:
    """Leading prompt tokens the sequence's slot KV holds at their own positions: what another
    request may reuse. A generation shift moves everything after n_keep."""
    return min(seq.num_prefilled, seq.num_intact_prompt)


def reusable_kv_tokens(seq: Sequence, with_generated: bool) -> np.ndarray:
    """The tokens the sequence's slot KV holds at their own positions, from position 0: the
    prompt and (with_generated) the generated tokens fed back, unless a shift moved them (then
    only the prompt tokens before the shifted part)."""
    num_generated_in_kv = seq.n_past - len(seq.prompt_tokens)
    if not with_generated or seq.tokens_shifted_out or num_generated_in_kv <= 0:
        return seq.prompt_array[:reusable_prompt_length(seq)]
    return adapter_marked(np.asarray(seq.prompt_tokens + seq.output_tokens[:num_generated_in_kv], dtype=np.int64),
                          seq.adapter)


ADAPTER_MARK = 1 << 40  # above any token id (media placeholders are negative)


def adapter_marked(tokens: np.ndarray, adapter: int) -> np.ndarray:
    """Tokens as prefixes compare them: under adapter set `adapter` (0: none), the first is
    marked, so that no prefix is shared between adapter sets (the KV differs)."""
    if adapter and len(tokens):
        tokens[0] += adapter * ADAPTER_MARK
    return tokens


def scores_prompt(seq: Sequence) -> bool:
    """Whether every prompt token's log probability is computed (then no prefix is reused: a
    cache keeps KV, not the rows that scored it)."""
    return seq.params.prompt_logprobs is not None


def ends_as_code_completion(params: SamplingParams, pieces: OutputPieces, text: str, seconds_generating: float) -> bool:
    """An editor's limits (llama-server's, reported as limits as it reports them): a line
    indented less than min_indent, or a new line after newline_deadline_ms of generating."""
    deadline_ms = params.newline_deadline_ms
    return pieces.assembler.reached_indent_limit or (
        deadline_ms > 0 and "\n" in text and seconds_generating * 1000 > deadline_ms)
