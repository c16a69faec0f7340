"""A streamed answer (the engine's deltas, each choice's Result, or the failure that ends it:
multiseq.server.chat's CompletionCall.events) as the Responses API's server-sent events
(`EventTranslator`).

Part of the Responses API's translation onto the Chat Completions path (multiseq.server.responses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formats.openai_output import usage_of as chat_usage_of
from ..request import Result
from ..tools import ArgumentsDelta, Delta, ReasoningDelta, TextDelta, ToolCallStart
from .errors import ApiError, internal_error
from .responses_input import new_id, text_part
from .responses_output import (Outcome, function_call_item, message_output_item, reasoning_item, response_object,
                               usage_of)
from .responses_request import ResponsesRequest


@dataclass
class _OpenItem:
    """The output item being streamed: what kind, where, and its text (or arguments) so far."""

    kind: str  # "reasoning", "message" or "function_call"
    output_index: int
    item_id: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    chat_index: int = -1  # for a call: its index among the chat delta's tool_calls


class EventTranslator:
    """A streamed answer's deltas and end in, the Responses API's stream events out
    (dicts; `sse` writes them). Items open in the order the model writes them and close when the next begins, so
    the streamed output equals the non-streamed one: reasoning, text, then the calls."""

    def __init__(self, request: ResponsesRequest, response_id: str, created_at: int, model: str) -> None:
        self._request = request
        self._response_id = response_id
        self._created_at = created_at
        self._model = model
        self._sequence_number = 0
        self._open: _OpenItem | None = None
        self._output: list[dict[str, Any]] = []
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._error: dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None  # the final Response object, once finished

    def start(self) -> list[dict[str, Any]]:
        """response.created and response.in_progress."""
        snapshot = self._response(None)
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, event: Delta | Result | ApiError) -> list[dict[str, Any]]:
        """The Responses events one delta makes (none for the end and a failure, said when the
        response finishes)."""
        if isinstance(event, ReasoningDelta):
            return self._text_delta("reasoning", event.text) if event.text else []
        if isinstance(event, TextDelta):
            return self._text_delta("message", event.text) if event.text else []
        if isinstance(event, ToolCallStart):
            return self._call_begins(event)
        if isinstance(event, ArgumentsDelta):
            return self._arguments(event.text)
        if isinstance(event, Result):
            self._finish_reason = event.finish_reason.value
            self._usage = usage_of(chat_usage_of([event]))
        else:
            self._error = {"code": "server_error", "message": event.message or "The response failed."}
        return []

    def finish(self) -> list[dict[str, Any]]:
        """Close the open item and end with response.completed, .incomplete or .failed (a
        cancelled response ends as failed, its status saying cancelled)."""
        outcome = Outcome.of(self._finish_reason)
        if self._error is None and not self._output and self._open is None:
            events = self._open_item("message", new_id("msg"))  # a response always says something
        else:
            events = []
        ended = "incomplete" if self._error is not None else outcome.item_status
        events += self._close_open_item(ended)
        self.response = self._response(outcome)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            self.response["status"], "response.failed")
        return [*events, self._event(kind, response=self.response)]

    def snapshot(self, outcome: Outcome | None = None) -> dict[str, Any]:
        """The Response object as it stands: the items finished so far."""
        return self._response(outcome)

    def cancel(self) -> None:
        """The response was cancelled on request: it ends so, not as the failure its stopped
        generation reports."""
        self._finish_reason = "cancelled"
        self._error = None

    def error_event(self) -> dict[str, Any]:
        """The `error` event of a stream that broke after its first event (details in the log)."""
        error = internal_error()
        return self._event("error", code=error.code or error.kind, message=error.message, param=None)

    # --- items ---

    def _text_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._close_open_item("completed")
            events += self._open_item(kind, new_id("rs" if kind == "reasoning" else "msg"))
        self._open.text += text
        delta_type = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self._event(delta_type, **self._where(), content_index=0, delta=text, **extra)]

    def _call_begins(self, call: ToolCallStart) -> list[dict[str, Any]]:
        return self._close_open_item("completed") + self._open_item(
            "function_call", new_id("fc"), call_id=call.id, name=call.name, chat_index=call.index)

    def _arguments(self, arguments: str) -> list[dict[str, Any]]:
        if not arguments or self._open is None or self._open.kind != "function_call":
            return []
        self._open.text += arguments
        return [self._event("response.function_call_arguments.delta", **self._where(), delta=arguments)]

    def _open_item(self, kind: str, item_id: str, **details: Any) -> list[dict[str, Any]]:
        self._open = _OpenItem(kind, len(self._output), item_id, **details)
        events = [self._event("response.output_item.added", output_index=self._open.output_index,
                              item=self._item("in_progress", is_added=True))]
        if kind != "function_call":
            events.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                      part=self._part(text="")))
        return events

    def _close_open_item(self, status: str) -> list[dict[str, Any]]:
        open_item = self._open
        if open_item is None:
            return []
        where = self._where()
        if open_item.kind == "function_call":
            events = [self._event("response.function_call_arguments.done", **where, name=open_item.name,
                                  arguments=open_item.text)]
        else:
            done = "response.reasoning_text.done" if open_item.kind == "reasoning" else "response.output_text.done"
            extra = {} if open_item.kind == "reasoning" else {"logprobs": []}
            events = [self._event(done, **where, content_index=0, text=open_item.text, **extra),
                      self._event("response.content_part.done", **where, content_index=0,
                                  part=self._part(text=open_item.text))]
        item = self._item(status)
        self._output.append(item)
        self._open = None
        return [*events, self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _item(self, status: str, is_added: bool = False) -> dict[str, Any]:
        open_item = self._open
        if open_item.kind == "function_call":
            return function_call_item(open_item.item_id, open_item.call_id, open_item.name,
                                      "" if is_added else open_item.text, status)
        make = reasoning_item if open_item.kind == "reasoning" else message_output_item
        item = make(open_item.item_id, open_item.text, status)
        if is_added:
            item["content"] = []  # the parts come with their own events
        return item

    def _part(self, text: str) -> dict[str, Any]:
        if self._open.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return text_part("output_text", text)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open.item_id, "output_index": self._open.output_index}

    # --- envelopes ---

    def _response(self, outcome: Outcome | None) -> dict[str, Any]:
        return response_object(self._request, self._response_id, self._created_at, self._model, outcome,
                               list(self._output), self._usage, self._error)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence_number, **fields}
        self._sequence_number += 1
        return event
