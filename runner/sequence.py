"""The Sequence: all of one request's state while it waits, prefills and decodes in a slot.

Its methods are the only code that changes that state; the scheduler moves sequences between
the queue and the slots, and the engine calls these methods with what each step produced.
"""

from __future__ import annotations

import time
from enum import Enum

import numpy as np

from .config import OverflowPolicy, SamplingParams
from .detok import TextAssembler
from .logprobs import TokenLogprob
from .request import FinishReason, Result, Timings
from .sampling import SequenceSampler


class SequenceStatus(Enum):
    WAITING = "waiting"
    PREFILLING = "prefill"
    DECODING = "decode"
    FINISHED = "finished"


class Sequence:
    """One request in the engine: its prompt, its slot's KV accounting, its output so far."""

    def __init__(self, request_id: str, prompt_tokens: list[int], sampler: SequenceSampler, n_keep: int,
                 overflow: OverflowPolicy, prompt_tokens_dropped: int = 0, submitted_at: float | None = None) -> None:
        self.id = request_id
        self.prompt_tokens = prompt_tokens
        self.sampler = sampler
        self.n_keep = n_keep
        self.overflow = overflow
        self.prompt_tokens_dropped = prompt_tokens_dropped
        self.assembler = TextAssembler(sampler.params.stop)
        self.status = SequenceStatus.WAITING
        self.slot: int | None = None
        self.output_tokens: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if sampler.params.logprobs else None
        self.text_parts: list[str] = []
        self.num_prefilled = 0  # prompt tokens in the slot's KV (reused or decoded)
        self.num_cached = 0  # prompt tokens reused from a prefix already in some slot's KV
        self.num_intact_prompt = len(prompt_tokens)  # prompt tokens still at their positions after shifts
        self.n_past = 0  # tokens in the slot's KV; the next token goes at this position
        self._prompt_array: np.ndarray | None = None
        self.tokens_shifted_out = 0
        self.is_cancel_requested = False
        self.is_window_exhausted = False  # the window filled up and could not slide
        self.has_reached_stop_string = False
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.submitted_at = time.perf_counter() if submitted_at is None else submitted_at
        self.admitted_at: float | None = None
        self.prefilled_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    # --- derived state -------------------------------------------------------------------

    @property
    def params(self) -> SamplingParams:
        return self.sampler.params

    @property
    def num_prompt_remaining(self) -> int:
        return len(self.prompt_tokens) - self.num_prefilled

    @property
    def prompt_array(self) -> np.ndarray:
        """The prompt as int32 tokens, for comparing prefixes."""
        if self._prompt_array is None:
            self._prompt_array = np.asarray(self.prompt_tokens, dtype=np.int32)
        return self._prompt_array

    @property
    def num_reusable_prompt_tokens(self) -> int:
        """Leading prompt tokens the slot's KV holds at their own positions: what another
        request may reuse. A generation shift moves everything after n_keep."""
        return min(self.num_prefilled, self.num_intact_prompt)

    @property
    def last_token(self) -> int:
        """The newest generated token: not yet in the KV, it is what the next step decodes."""
        return self.output_tokens[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_running(self) -> bool:
        return self.status in (SequenceStatus.PREFILLING, SequenceStatus.DECODING)

    @property
    def is_truncated(self) -> bool:
        return self.prompt_tokens_dropped > 0 or self.tokens_shifted_out > 0 or self.is_window_exhausted

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    # --- transitions -----------------------------------------------------------------------

    def admit(self, slot: int, now: float, num_cached: int = 0) -> None:
        """Waiting -> prefilling in `slot`, whose KV already holds the first num_cached
        prompt tokens (a reused prefix)."""
        assert self.status is SequenceStatus.WAITING
        assert 0 <= num_cached < len(self.prompt_tokens), "the last prompt token is always decoded"
        self.slot = slot
        self.status = SequenceStatus.PREFILLING
        self.admitted_at = now
        self.num_cached = self.num_prefilled = self.n_past = num_cached

    def drop_cached_prefix(self) -> None:
        """The reused prefix turned out not to be intact in the KV: prefill the whole prompt."""
        assert self.status is SequenceStatus.PREFILLING and self.n_past == self.num_cached
        self.num_cached = self.num_prefilled = self.n_past = 0

    def record_decoded(self, num_tokens: int, is_prefill: bool, now: float) -> None:
        """A step put num_tokens of this sequence into its slot's KV."""
        self.n_past += num_tokens
        if is_prefill:
            self.num_prefilled += num_tokens
            if self.num_prompt_remaining == 0:
                self.status = SequenceStatus.DECODING
                self.prefilled_at = now

    def record_shift(self, keep: int, discard: int) -> None:
        """The slot's KV dropped `discard` positions after `keep` and moved the rest back."""
        self.n_past -= discard
        self.tokens_shifted_out += discard
        self.num_intact_prompt = min(self.num_intact_prompt, keep)

    def append_token(self, token: int, piece: bytes, is_end_of_generation: bool,
                     now: float) -> tuple[str, FinishReason | None]:
        """Take one sampled token: the text it makes ready to emit, and why the sequence ends
        here (None while it goes on)."""
        self.sampler.accept(token)
        self.output_tokens.append(token)
        if self.first_token_at is None:
            self.first_token_at = now
        if is_end_of_generation and not self.params.ignore_eos:
            return "", FinishReason.STOP
        if self.logprobs is not None and self.sampler.last_logprob is not None:
            self.logprobs.append(self.sampler.last_logprob)
        text, self.has_reached_stop_string = self.assembler.feed(piece)
        if text:
            self.text_parts.append(text)
        if self.has_reached_stop_string or self.sampler.is_constraint_complete:
            return text, FinishReason.STOP
        if len(self.output_tokens) >= self.params.max_tokens:
            return text, FinishReason.LENGTH
        return text, None

    def request_cancel(self) -> None:
        self.is_cancel_requested = True

    def exhaust_window(self) -> None:
        """The window is full and cannot slide: the sequence ends as length, truncated."""
        self.is_window_exhausted = True

    def finish(self, reason: FinishReason, error: str | None, now: float) -> str:
        """End the sequence; return the held text this releases.

        Held text (a possible stop-string start) is released when generation ends by itself
        or fails; never after a stop string, and never on cancel, so that nothing is emitted
        for a request after cancel() returned."""
        assert not self.is_finished
        releases_held_text = (self.status is not SequenceStatus.WAITING and reason is not FinishReason.CANCELLED
                              and not self.has_reached_stop_string)
        text = self.assembler.flush() if releases_held_text else ""
        if text:
            self.text_parts.append(text)
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.finished_at = now
        return text

    # --- reporting -------------------------------------------------------------------------

    def timings(self) -> Timings:
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        return Timings(
            queue_wait_s=_elapsed(self.submitted_at, self.admitted_at),
            ttft_s=_elapsed(self.submitted_at, self.first_token_at),
            prefill_tokens_per_s=_rate(self.num_prefilled - self.num_cached, self.admitted_at, self.prefilled_at),
            decode_tokens_per_s=_rate(len(self.output_tokens) - 1, self.first_token_at, self.finished_at),
            total_s=end - self.submitted_at,
        )

    def to_result(self) -> Result:
        assert self.finish_reason is not None, "only a finished sequence has a result"
        return Result(
            id=self.id,
            text=self.text,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_tokens) + self.prompt_tokens_dropped,
            prompt_tokens_cached=self.num_cached,
            completion_tokens=len(self.output_tokens),
            timings=self.timings(),
            error=self.error,
            truncated=self.is_truncated,
            prompt_tokens_dropped=self.prompt_tokens_dropped,
            tokens_shifted_out=self.tokens_shifted_out,
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
        )


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _rate(count: int, start: float | None, end: float | None) -> float | None:
    if start is None or end is None or count <= 0 or end <= start:
        return None
    return count / (end - start)
