"""Requests, results, and the Sequence that owns all of one request's state while it runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from runner.config import OverflowPolicy, SamplingParams
from runner.detok import TextAssembler
from runner.sampling import SequenceSampler

CHAT_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Request:
    """One prompt (a string, or chat messages rendered with the model's template) to complete.

    `n_keep` and `overflow` override the runner's sliding settings for this request only.
    """

    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    id: str | None = None  # None: the runner assigns "req-N" in arrival order
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_keep: int | None = None
    overflow: OverflowPolicy | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a request needs exactly one of prompt or messages")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise ValueError("prompt must be a non-empty string")
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(self.messages))
            _check_messages(self.messages)
        if self.id is not None and not isinstance(self.id, str):
            object.__setattr__(self, "id", str(self.id))
        if self.overflow is not None:
            object.__setattr__(self, "overflow", OverflowPolicy(self.overflow))
        if self.n_keep is not None and (not isinstance(self.n_keep, int) or self.n_keep < 0):
            raise ValueError(f"n_keep must be an integer >= 0, got {self.n_keep!r}")


def _check_messages(messages: tuple[dict, ...]) -> None:
    if not messages:
        raise ValueError("messages must not be empty")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise ValueError(f"message {index} must be an object with only 'role' and 'content'")
        if message.get("role") not in CHAT_ROLES:
            raise ValueError(f"message {index} has role {message.get('role')!r}; expected one of {', '.join(CHAT_ROLES)}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"message {index} content must be a string")


class FinishReason(str, Enum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens reached, or the slot's window was full and could not shift
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class Timings:
    queue_wait_s: float | None  # submitted -> given a slot
    ttft_s: float | None  # submitted -> first generated token
    prefill_tokens_per_s: float | None  # prompt tokens / (slot given -> prompt fully decoded)
    decode_tokens_per_s: float | None  # tokens after the first / (first token -> finished)
    total_s: float


@dataclass(frozen=True)
class Result:
    """How one request ended. `ok` is true for stop and length; cancelled requests keep the
    text they produced, and a request cancelled before it started has an error saying so."""

    id: str
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings
    error: str | None = None
    truncated: bool = False  # the prompt was slid or the generation was shifted
    prompt_tokens_dropped: int = 0
    tokens_shifted_out: int = 0

    @property
    def ok(self) -> bool:
        return self.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


class SequenceStatus(Enum):
    WAITING = "waiting"
    PREFILLING = "prefill"
    DECODING = "decode"
    FINISHED = "finished"


class ResultSink(Protocol):
    """Where a sequence's text pieces and final result go (a request handle)."""

    def emit(self, text: str) -> None: ...

    def finish(self, result: Result) -> None: ...


class Sequence:
    """Everything about one request while it waits, prefills and decodes in a slot."""

    def __init__(self, request_id: str, prompt_tokens: list[int], sampler: SequenceSampler, sink: ResultSink,
                 n_keep: int, overflow: OverflowPolicy, submitted_at: float | None = None) -> None:
        self.id = request_id
        self.prompt_tokens = prompt_tokens
        self.sampler = sampler
        self.sink = sink
        self.n_keep = n_keep
        self.overflow = overflow
        self.assembler = TextAssembler(sampler.params.stop)
        self.status = SequenceStatus.WAITING
        self.slot: int | None = None
        self.output_tokens: list[int] = []
        self.text_parts: list[str] = []
        self.num_prefilled = 0  # prompt tokens already decoded into the slot's KV
        self.n_past = 0  # tokens in the slot's KV; the next token goes at this position
        self.prompt_tokens_dropped = 0
        self.tokens_shifted_out = 0
        self.is_cancel_requested = False
        self.is_window_exhausted = False  # the window filled up and could not slide
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.submitted_at = time.perf_counter() if submitted_at is None else submitted_at
        self.admitted_at: float | None = None
        self.prefilled_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    @property
    def params(self) -> SamplingParams:
        return self.sampler.params

    @property
    def num_prompt_remaining(self) -> int:
        return len(self.prompt_tokens) - self.num_prefilled

    @property
    def last_token(self) -> int:
        """The newest generated token: not yet in the KV, it is what the next step decodes."""
        return self.output_tokens[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_truncated(self) -> bool:
        return self.prompt_tokens_dropped > 0 or self.tokens_shifted_out > 0 or self.is_window_exhausted

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def timings(self) -> Timings:
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        return Timings(
            queue_wait_s=_elapsed(self.submitted_at, self.admitted_at),
            ttft_s=_elapsed(self.submitted_at, self.first_token_at),
            prefill_tokens_per_s=_rate(self.num_prefilled, self.admitted_at, self.prefilled_at),
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
            completion_tokens=len(self.output_tokens),
            timings=self.timings(),
            error=self.error,
            truncated=self.is_truncated,
            prompt_tokens_dropped=self.prompt_tokens_dropped,
            tokens_shifted_out=self.tokens_shifted_out,
        )


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _rate(count: int, start: float | None, end: float | None) -> float | None:
    if start is None or end is None or count <= 0 or end <= start:
        return None
    return count / (end - start)
