"""What a caller hands the runner (Request) and what it gets back (Result)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from .config import CONTEXT_POOLINGS, DEFAULT_POOLING, OverflowPolicy, SamplingParams
from .sampling.logprobs import TokenLogprob
from .llama.media import MEDIA_MARKER, MEDIA_PART_TYPES
from .tools import ChoiceMode, Tool, ToolCall, ToolChoice

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: a system message, except
# for a template with a developer role of its own (gpt-oss)
# What a message may hold besides role and content: an assistant's calls, a tool result's call id.
_MESSAGE_FIELDS = {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}


class Priority:
    """Named priorities (any int works; higher is admitted first and may preempt lower).
    A person waiting on a stream outranks a file or a Batch API job."""

    BATCH = 0
    INTERACTIVE = 10


@dataclass(frozen=True)
class Request:
    """One prompt (a string, its token ids, or chat messages rendered with the model's template)
    to complete.

    `n_keep` and `overflow` override the runner's sliding settings for this request only.
    `priority` orders admission (higher first; see Priority): the default is batch work.
    `tools` are functions the model may call (rendered into the prompt, their calls constrained
    by a grammar and parsed into Result.tool_calls); `tool_choice` says whether it must
    (default: auto), and `parallel_tool_calls` whether one answer may hold several calls.
    Messages follow OpenAI's chat shape: an assistant message may carry `tool_calls` (content
    None), a `tool` message answers one by its `tool_call_id`.
    """

    prompt: str | tuple[int, ...] | None = None  # token ids go to the model as they are
    messages: tuple[dict, ...] | None = None
    id: str | None = None  # None: the runner assigns "req-N" in arrival order
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_keep: int | None = None
    overflow: OverflowPolicy | None = None
    priority: int = Priority.BATCH
    tools: tuple[Tool, ...] | None = None
    tool_choice: ToolChoice | None = None  # None: auto when there are tools
    parallel_tool_calls: bool = True
    # Values the chat template is rendered with besides messages and tools (enable_thinking,
    # reasoning_effort, ...): a chat's switches that the template reads.
    template_options: Mapping[str, Any] | None = None
    # An embedding request: its prompt's embedding, pooled so (one of POOLINGS, or "default": as
    # the runner pools), is the result (Result.embedding); nothing is generated. "rank", on a
    # reranker: the prompt is a query and a document together (the backend's rerank_tokens), and
    # the result its scores, the first being its relevance.
    embed: str | None = None
    # Images (or audio) a prompt string refers to, in order: each stands where the prompt holds
    # multiseq.MEDIA_MARKER. A chat's media are parts of its messages' content instead:
    # {"type": "image", "data": bytes} (or "audio").
    media: tuple[bytes, ...] = ()
    # A LoRA adapter of the runner's (RunnerConfig.lora_modules, by name) on this request alone:
    # its steps run through it (steps group the sequences by adapter); None: the model's own.
    adapter: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a request needs exactly one of prompt or messages")
        if isinstance(self.prompt, (list, tuple)):
            if not self.prompt or not all(isinstance(token, int) and not isinstance(token, bool) and token >= 0
                                          for token in self.prompt):
                raise ValueError("prompt must be a non-empty string or a non-empty list of token ids (integers >= 0)")
            object.__setattr__(self, "prompt", tuple(self.prompt))
        elif self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
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
        self._check_tools()
        self._check_media()
        if self.embed is not None:
            if self.embed not in (*CONTEXT_POOLINGS, DEFAULT_POOLING):
                raise ValueError(f"embed must be one of {', '.join(CONTEXT_POOLINGS)} or {DEFAULT_POOLING}, "
                                 f"got {self.embed!r}")
            if self.prompt is None:
                raise ValueError("an embedding request needs a prompt (text or token ids), not messages")

    def _check_media(self) -> None:
        object.__setattr__(self, "media", tuple(self.media))
        if not all(isinstance(data, (bytes, bytearray)) and data for data in self.media):
            raise ValueError("media must be non-empty bytes (an image's or audio's file content)")
        if self.media and not isinstance(self.prompt, str):
            raise ValueError("media go with a prompt string that places them (multiseq.MEDIA_MARKER); a chat's "
                             "media are parts of its messages")
        if self.media and self.prompt.count(MEDIA_MARKER) != len(self.media):
            raise ValueError(f"the prompt places {self.prompt.count(MEDIA_MARKER)} media (MEDIA_MARKER), and "
                             f"{len(self.media)} are given")

    @property
    def all_media(self) -> list[bytes]:
        """Every medium of the request in prompt order: the prompt's, or its messages' parts."""
        if self.messages is None:
            return list(self.media)
        return [part["data"] for message in self.messages if isinstance(message.get("content"), (list, tuple))
                for part in message["content"] if part.get("type") in MEDIA_PART_TYPES]

    def _check_tools(self) -> None:
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))
            if not all(isinstance(tool, Tool) for tool in self.tools):
                raise ValueError("tools must be Tool objects")
            names = [tool.name for tool in self.tools]
            duplicate = next((name for name in names if names.count(name) > 1), None)
            if duplicate is not None:
                raise ValueError(f"tools holds two functions named {duplicate!r}")
        choice = self.tool_choice
        if choice is not None and not isinstance(choice, ToolChoice):
            raise ValueError(f"tool_choice must be a ToolChoice, got {choice!r}")
        if choice is not None and choice.mode is ChoiceMode.FUNCTION and choice.name not in {
                tool.name for tool in self.tools or ()}:
            raise ValueError(f"tool_choice names the function {choice.name!r}, which is not among the tools")
        if choice is not None and choice.forces_call and not self.tools:
            raise ValueError(f"tool_choice {choice.mode.value!r} needs tools")
        if not isinstance(self.parallel_tool_calls, bool):
            raise ValueError(f"parallel_tool_calls must be true or false, got {self.parallel_tool_calls!r}")
        if self.tools and self.prompt is not None:
            raise ValueError("tools need chat messages (the prompt is rendered by the chat template), not a prompt")
        if self.template_options is not None:
            if not isinstance(self.template_options, Mapping) or not all(
                    isinstance(key, str) for key in self.template_options):
                raise ValueError("template_options must map names to values")
            if self.prompt is not None:
                raise ValueError("template_options need chat messages (the prompt is not rendered by a template)")

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """The choice in force: the given one, else auto with tools and none without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return ToolChoice(ChoiceMode.AUTO if self.tools else ChoiceMode.NONE)

    @property
    def uses_tools(self) -> bool:
        """Whether the output may hold calls (tools offered, and the choice is not none)."""
        return bool(self.tools) and self.effective_tool_choice.mode is not ChoiceMode.NONE


def _check_messages(messages: tuple[dict, ...]) -> None:
    if not messages:
        raise ValueError("messages must not be empty")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - _MESSAGE_FIELDS:
            raise ValueError(f"message {index} must be an object with 'role' and 'content' (and, for tool "
                             f"calling, 'tool_calls', 'tool_call_id' or 'name')")
        if message.get("role") not in CHAT_ROLES:
            raise ValueError(f"message {index} has role {message.get('role')!r}; expected one of {', '.join(CHAT_ROLES)}")
        content = message.get("content")
        may_be_empty = message.get("role") == "assistant" and message.get("tool_calls")
        if not (isinstance(content, str) or _is_text_parts(content) or (content is None and may_be_empty)):
            raise ValueError(f"message {index} content must be a string or a list of text parts")
        if message.get("tool_calls") is not None:
            _check_calls(message["tool_calls"], index)
        if message.get("role") == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise ValueError(f"message {index} is a tool result and needs a 'tool_call_id' string")


def _is_text_parts(content: object) -> bool:
    """[{"type": "text", "text": "..."}, {"type": "image", "data": b"..."}, ...]: content given in
    parts, as OpenAI's API allows (media as their files' bytes)."""
    return isinstance(content, (list, tuple)) and all(isinstance(part, dict) and (
        part.get("type") == "text" and isinstance(part.get("text"), str)
        or part.get("type") in MEDIA_PART_TYPES and isinstance(part.get("data"), (bytes, bytearray)) and part["data"])
        for part in content)


def _check_calls(calls: object, index: int) -> None:
    """An assistant's calls in OpenAI's shape: [{"id", "type": "function", "function": {"name", "arguments"}}]."""
    if not isinstance(calls, (list, tuple)):
        raise ValueError(f"message {index} tool_calls must be a list")
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"message {index} tool_calls[{number}] needs 'function': {{'name', 'arguments'}}")


class FinishReason(str, Enum):
    STOP = "stop"  # end-of-generation token or a stop string
    TOOL_CALLS = "tool_calls"  # ended by itself, having called tools (Result.tool_calls)
    LENGTH = "length"  # max_tokens reached, or the slot's window was full and could not shift
    CANCELLED = "cancelled"
    ERROR = "error"


# How a request may end and still count as a success.
ENDED_WELL = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS)


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
    # The end-of-generation token that ended the output, with its log probability (logprobs asked).
    end_logprob: TokenLogprob | None = None
    # With prompt_logprobs: the prompt's tokens (ids and bytes), and the log probability of each
    # after the first.
    prompt_token_ids: tuple[int, ...] = ()
    prompt_token_bytes: tuple[bytes, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    # The request could not run as given (it failed before it was queued): a client error.
    is_invalid_request: bool = False
    # The output ended (stop) but is not valid under the request's JSON schema: why.
    schema_error: str | None = None
    # What the constraint left out of the request's JSON schema because its grammar cannot
    # enforce it (keywords such as "not" or "uniqueItems", "format: uri-reference", ...): the
    # output was validated against them afterwards. Empty when the schema was enforced exactly.
    approximated: tuple[str, ...] = ()
    # With tools: the calls the model made (`text` is then the content around them), what it
    # reasoned (<think>...</think>, kept out of `text`), and why text that began a call could
    # not be read as one (the text is then kept in `text`).
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    tool_call_error: str | None = None
    reasoning_tokens: int = 0  # of completion_tokens, those inside the reasoning block (a reasoning chat's)
    stop_string: str | None = None  # the stop string that ended the output (finish_reason stop)
    # Speculative decoding: draft tokens verified for this request, and how many came true
    # (OpenAI's accepted/rejected_prediction_tokens are these and their difference).
    draft_tokens: int = 0
    draft_tokens_accepted: int = 0
    # An embedding request's embedding (float32): a vector, or with pooling none a row per token.
    embedding: Any = None

    @property
    def ok(self) -> bool:
        return self.finish_reason in ENDED_WELL and self.schema_error is None

    @classmethod
    def rejected(cls, request_id: str, error: str, prompt_tokens: int = 0) -> Result:
        """The result of a request that cannot run as given (found before it was queued);
        prompt_tokens is the prompt's size when that was the reason (it does not fit)."""
        return cls(id=request_id, text="", finish_reason=FinishReason.ERROR, prompt_tokens=prompt_tokens, completion_tokens=0,
                   timings=NO_TIMINGS, error=error, is_invalid_request=True)

    def failed_with(self, error: str) -> Result:
        """This result turned into a failure (what it computed is kept)."""
        return replace(self, finish_reason=FinishReason.ERROR, error=error)

    @classmethod
    def failed_before_start(cls, request_id: str, error: str) -> Result:
        """The result of a request that failed, not by its own fault, before it was queued."""
        return cls(id=request_id, text="", finish_reason=FinishReason.ERROR, prompt_tokens=0, completion_tokens=0,
                   timings=NO_TIMINGS, error=error)
