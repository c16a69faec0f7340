"""What a caller hands the runner (Request) and what it gets back (Result)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .config import OverflowPolicy, SamplingParams
from .logprobs import TokenLogprob

CHAT_ROLES = ("system", "user", "assistant")


class Priority:
    """Named priorities (any int works; higher is admitted first and may preempt lower).
    A person waiting on a stream outranks a file or a Batch API job."""

    BATCH = 0
    INTERACTIVE = 10


@dataclass(frozen=True)
class Request:
    """One prompt (a string, or chat messages rendered with the model's template) to complete.

    `n_keep` and `overflow` override the runner's sliding settings for this request only.
    `priority` orders admission (higher first; see Priority): the default is batch work.
    """

    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    id: str | None = None  # None: the runner assigns "req-N" in arrival order
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_keep: int | None = None
    overflow: OverflowPolicy | None = None
    priority: int = Priority.BATCH

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
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"priority must be an integer, got {self.priority!r}")


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


NO_TIMINGS = Timings(None, None, None, None, 0.0)


@dataclass(frozen=True)
class Result:
    """How one request ended. `ok` is true for stop and length, unless the output ended but
    does not validate against the request's JSON schema (`schema_error` says why; the text is
    kept). Cancelled requests keep the text they produced, and a request cancelled before it
    started has an error saying so."""

    id: str
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings
    error: str | None = None
    prompt_tokens_cached: int = 0  # of prompt_tokens, how many were reused from a prefix already computed
    prompt_tokens_from_ram: int = 0  # of those, how many were restored from host memory (--cache-ram)
    truncated: bool = False  # the prompt was slid or the generation was shifted
    prompt_tokens_dropped: int = 0
    tokens_shifted_out: int = 0
    # Per output token, when the request asked for logprobs (end-of-generation tokens excluded).
    logprobs: tuple[TokenLogprob, ...] | None = None
    # The request could not run as given (it failed before it was queued): a client error.
    is_invalid_request: bool = False
    # The output ended (stop) but is not valid under the request's JSON schema: why.
    schema_error: str | None = None
    # What the constraint left out of the request's JSON schema because its grammar cannot
    # enforce it (keywords such as "not" or "uniqueItems", "format: uri-reference", ...): the
    # output was validated against them afterwards. Empty when the schema was enforced exactly.
    approximated: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and self.schema_error is None

    @classmethod
    def rejected(cls, request_id: str, error: str) -> Result:
        """The result of a request that cannot run as given (found before it was queued)."""
        return cls(id=request_id, text="", finish_reason=FinishReason.ERROR, prompt_tokens=0, completion_tokens=0,
                   timings=NO_TIMINGS, error=error, is_invalid_request=True)

    @classmethod
    def failed_before_start(cls, request_id: str, error: str) -> Result:
        """The result of a request that failed, not by its own fault, before it was queued."""
        return cls(id=request_id, text="", finish_reason=FinishReason.ERROR, prompt_tokens=0, completion_tokens=0,
                   timings=NO_TIMINGS, error=error)
