"""A streamed answer (the engine's deltas, its Result, or the failure that ends it:
multiseq.server.chat's CompletionCall.events) as Anthropic's server-sent events, block by block (`MessageStream`, `message_events`), with pings while nothing comes.

Part of Anthropic's Messages API, translated at the door onto the Chat Completions path
(multiseq.server.messages).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..formats.openai_output import usage_of as chat_usage_of
from ..request import Result
from ..tools import ArgumentsDelta, Delta, ReasoningDelta, TextDelta, ToolCallStart
from .errors import ApiError
from .messages_errors import ERROR_TYPES_BY_STATUS, error_body, sse_event, stream_error_event
from .messages_output import stop_reason_of, tool_use_id, usage_of
from .messages_request import MessagesRequest

# Claude Code waits on long prompts without a byte for minutes; Anthropic pings to keep proxies
# and clients from timing out. Every 10 s keeps well inside the 15 s such clients tolerate.
PING_INTERVAL_S = 10.0
PING = sse_event("ping", {"type": "ping"})
EMPTY_BLOCKS = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking", "thinking": "", "signature": ""}}


@dataclass
class _OpenBlock:
    index: int
    kind: str  # "text", "thinking" or "tool_use"
    call_index: int | None = None  # the chat layer's index of a tool_use block's call


@dataclass
class MessageStream:
    """Turns an answer's deltas and its end into Anthropic's events, block
    by block: each kind (reasoning, text, a call) opens a block when the one before is of
    another kind."""

    request: MessagesRequest
    message_id: str
    _open: _OpenBlock | None = None
    _num_blocks: int = 0
    _finish_reason: str | None = None
    _stop_sequence: str | None = None
    _usage: dict[str, Any] | None = None
    _call_blocks: dict[int, int] = field(default_factory=dict)  # call index -> block index

    def start(self) -> list[str]:
        """message_start (empty content; the usage comes in message_delta, once known), a ping."""
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.request.model,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_of(None)}
        return [sse_event("message_start", {"type": "message_start", "message": message}), PING]

    def feed(self, event: Delta | Result) -> list[str]:
        """The Anthropic events of one delta (none for the end, said when the message finishes)."""
        if isinstance(event, ReasoningDelta) and event.text:
            return self._append("thinking", {"type": "thinking_delta", "thinking": event.text})
        if isinstance(event, TextDelta) and event.text:
            return self._append("text", {"type": "text_delta", "text": event.text})
        if isinstance(event, ToolCallStart):
            return self._open_block("tool_use", {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name,
                                                 "input": {}}, event.index)
        if isinstance(event, ArgumentsDelta) and event.text and event.index in self._call_blocks:
            return [self._delta(self._call_blocks[event.index], {"type": "input_json_delta", "partial_json": event.text})]
        if isinstance(event, Result):
            self._finish_reason = event.finish_reason.value
            self._stop_sequence = (event.stop_string if event.stop_string in self.request.stop_sequences else None)
            self._usage = chat_usage_of([event])
        return []

    def finish(self) -> list[str]:
        """Close the open block, then message_delta (stop reason, usage) and message_stop."""
        events = self._close()
        usage = usage_of(self._usage)
        delta = {"stop_reason": stop_reason_of(self._finish_reason, self._stop_sequence),
                 "stop_sequence": self._stop_sequence}
        events.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        events.append(sse_event("message_stop", {"type": "message_stop"}))
        return events

    def _append(self, kind: str, delta: dict[str, Any]) -> list[str]:
        is_open = self._open is not None and self._open.kind == kind
        events = [] if is_open else self._open_block(kind, dict(EMPTY_BLOCKS[kind]))
        return events + [self._delta(self._num_blocks - 1, delta)]

    def _open_block(self, kind: str, block: dict[str, Any], call_index: int | None = None) -> list[str]:
        events = self._close()
        self._open = _OpenBlock(self._num_blocks, kind, call_index)
        if call_index is not None:
            self._call_blocks[call_index] = self._num_blocks
        self._num_blocks += 1
        return events + [sse_event("content_block_start", {"type": "content_block_start", "index": self._open.index,
                                                            "content_block": block})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        index, events = self._open.index, []
        if self._open.kind == "thinking":  # Anthropic's clients expect a signature before it stops
            events.append(self._delta(index, {"type": "signature_delta", "signature": ""}))
        events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        self._open = None
        return events

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> str:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


async def message_events(parts: AsyncIterator[Delta | Result | ApiError], request: MessagesRequest, message_id: str,
                         ping_interval: float = PING_INTERVAL_S) -> AsyncIterator[str]:
    """The server-sent events of a streamed Message, from the answer's deltas and end; a `ping`
    whenever nothing came for `ping_interval` seconds (a long prompt waiting for its slot). A
    failure mid-stream ends it with an `error` event."""
    stream = MessageStream(request, message_id)
    for event in stream.start():
        yield event
    async for part in with_pings(parts, ping_interval):
        if part is None:
            yield PING
        elif isinstance(part, ApiError):
            yield stream_error_event(part.body())
            return
        else:
            for event in stream.feed(part):
                yield event
    try:
        events = stream.finish()
    except ApiError as error:  # cancelled: the server is shutting down
        yield sse_event("error", error_body(ERROR_TYPES_BY_STATUS[error.status], error.message))
        return
    for event in events:
        yield event


async def with_pings(items: AsyncIterator[Any], interval: float) -> AsyncIterator[Any]:
    """The items of `items`, with a None after every `interval` seconds that passed without one."""
    iterator = aiter(items)
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
