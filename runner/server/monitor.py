"""What the server's page shows, and the one place it is built: every model's slots and queue
(from the snapshot each runner's worker publishes, never by asking an engine), the request each
slot holds (which API, which client), the throughput and time to first token of the last minutes,
and the recent errors.

`Monitor.watch()` runs on the server's event loop: every WATCH_INTERVAL_S it sees whether a
runner published a new snapshot (or a model, an error or the history changed) and, while a page
listens, builds the page's state once, as JSON, for every page (`Monitor.events()`): a page
costs a write, never a snapshot of its own. Every SAMPLE_INTERVAL_S it samples the history,
whether a page listens or not, so a page opened later sees the minutes before it.

`WatchRequests`, an ASGI middleware, tells it where each request came from (its API, by the
path, and its client) and notes each error answered (the status and the message the client was
told, nothing more).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..loop.stats import QueuedSnapshot, RunnerSnapshot, SlotSnapshot

logger = logging.getLogger("multiseq.server")

WATCH_INTERVAL_S = 0.25  # how often the page may change: 4 times a second, as the terminal dashboard
SAMPLE_INTERVAL_S = 2.0
HISTORY_S = 600.0  # the plots span the last ten minutes
MAX_ERRORS = 20
MAX_ORIGINS = 4096  # requests remembered by id; the oldest forgotten first
MAX_ERROR_BODY = 4096  # bytes of an error's body read for its message
MAX_TEXT = 200  # characters of a client's name or an error's message kept

# The API a path belongs to, by its first match (llama-server's and Ollama's routes too).
_APIS = (("/v1/chat/completions", "chat"), ("/chat/completions", "chat"), ("/v1/completions", "completions"),
         ("/completion", "completion"), ("/v1/responses", "responses"), ("/v1/messages", "messages"),
         ("/api/", "ollama"), ("/infill", "infill"), ("/v1/embeddings", "embeddings"), ("/embedding", "embeddings"),
         ("/v1/rerank", "rerank"), ("/rerank", "rerank"), ("/v1/batches", "batch"), ("/v1/files", "files"))


@dataclass(frozen=True)
class RequestOrigin:
    """Where a request came from: its API, its client (address, and what it calls itself), and
    its route (`POST /v1/chat/completions`)."""

    api: str
    client: str
    route: str = ""


_ORIGIN: ContextVar[RequestOrigin | None] = ContextVar("multiseq_request_origin", default=None)


def api_of(path: str) -> str:
    return next((api for prefix, api in _APIS if path.startswith(prefix)), "other")


def _client_of(scope: Scope, headers: Headers) -> str:
    address = scope.get("client")
    where = f"{address[0]}:{address[1]}" if address else "?"
    agent = headers.get("user-agent", "").split(" ")[0]  # "OpenAI/Python", "claude-cli/2.1.197", "ollama-python/0.5"
    return (f"{where} {agent}" if agent else where)[:MAX_TEXT]


class WatchRequests:
    """Says each request's origin to the routes (a context variable the submitting code reads),
    and notes every error answered, with the message its body gave the client."""

    def __init__(self, app: ASGIApp, monitor: Monitor, probe_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.monitor = monitor
        self._probe_paths = frozenset(probe_paths)  # /health: a 503 there says a state, not an error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        _ORIGIN.set(RequestOrigin(api_of(path), _client_of(scope, Headers(scope=scope)),
                                  f"{scope['method']} {path}"[:MAX_TEXT]))
        status, body = 0, bytearray()

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif status >= 400 and len(body) < MAX_ERROR_BODY:
                body.extend(message.get("body", b"")[:MAX_ERROR_BODY - len(body)])
                if not message.get("more_body", False) and path not in self._probe_paths:
                    self.monitor.note_error(scope["method"], path, status, _message_of(bytes(body)))
            await send(message)

        await self.app(scope, receive, watched_send)


def _message_of(body: bytes) -> str:
    """The message an error body told its client (OpenAI's, Anthropic's or Ollama's shape)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:MAX_TEXT]
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message if message is not None else parsed)[:MAX_TEXT]


class Monitor:
    """The page's state, built once per change for every page listening, with its history."""

    def __init__(self, models: Iterable, metrics, api_key_required: bool) -> None:
        self._models = models  # ServedModels: each with its name, status and runner (None: not loaded)
        self._metrics = metrics
        self._api_key_required = api_key_required
        self._origins: OrderedDict[str, RequestOrigin] = OrderedDict()
        self._errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERRORS)
        self._num_errors = 0
        self._history: deque[dict[str, Any]] = deque(maxlen=int(HISTORY_S / SAMPLE_INTERVAL_S))
        self._last_sample: tuple[float, int, float, float] | None = None  # time, tokens, TTFT sum, count
        self._started_at = time.time()
        self._seen: tuple | None = None  # what the page's state was last built from
        self.payload = ""  # the page's state as JSON, as last built
        self.num_built = 0  # states built so far: one per change, however many pages listen
        self._changed = asyncio.Event()
        self._num_pages = 0
        self._is_closed = False  # the server is shutting down: the pages' streams end
        self._task: asyncio.Task | None = None

    # --- what the server tells it -------------------------------------------------------------

    def note_submitted(self, request_ids: Iterable[str]) -> None:
        """Requests queued by the route running now: remembered with its origin."""
        origin = _ORIGIN.get()
        if origin is None:
            return
        for request_id in request_ids:
            self._origins[request_id] = origin
        while len(self._origins) > MAX_ORIGINS:
            self._origins.popitem(last=False)

    def note_error(self, method: str, path: str, status: int, message: str) -> None:
        self._errors.append({"at": time.time(), "status": status, "route": f"{method} {path}"[:MAX_TEXT],
                             "api": api_of(path), "message": message[:MAX_TEXT]})
        self._num_errors += 1

    def note_failed_stream(self, status: int, message: str) -> None:
        """A stream that ended with an error event: its status went out as 200, so the error is
        noted here, as its client was told it (by the route running now)."""
        origin = _ORIGIN.get()
        method, _, path = (origin.route if origin is not None else "").partition(" ")
        self.note_error(method, path, status, message)

    # --- the watch ------------------------------------------------------------------------------

    def start(self) -> None:
        """Watch on the running loop (idempotent; call on the loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.watch(), name="multiseq-page")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def close(self) -> None:
        """End every page's stream (on the loop: the server is shutting down)."""
        self._is_closed = True
        self._changed.set()

    async def watch(self) -> None:
        next_sample = 0.0
        while True:
            now = time.monotonic()
            try:
                if now >= next_sample:
                    self.sample()
                    next_sample = now + SAMPLE_INTERVAL_S
                if self._num_pages:
                    self.refresh()
            except Exception:  # noqa: BLE001 - the page shows the next state; the serving goes on
                logger.exception("building the page's state failed")
            await asyncio.sleep(WATCH_INTERVAL_S)

    def sample(self) -> None:
        """One point of the plots: tokens/s and mean time to first token since the last point."""
        now = time.time()
        tokens = sum(model.runner.latest_snapshot.stats.generated_tokens for model in self._models
                     if model.runner is not None)
        ttft_sum, ttft_count = _histogram_totals(self._metrics.ttft)
        if self._last_sample is not None:
            then, last_tokens, last_sum, last_count = self._last_sample
            count = ttft_count - last_count
            self._history.append({"at": now, "tokens_per_s": max(0, tokens - last_tokens) / max(now - then, 1e-3),
                                  "ttft_s": (ttft_sum - last_sum) / count if count > 0 else None,
                                  "requests": int(count)})
        self._last_sample = (now, tokens, ttft_sum, ttft_count)

    def refresh(self) -> bool:
        """Build the page's state when what it shows changed; whether it did."""
        seen = (tuple((model.status, None if model.runner is None else id(model.runner.latest_snapshot))
                      for model in self._models), self._num_errors, len(self._history),
                self._history[-1]["at"] if self._history else None)
        if seen == self._seen:
            return False
        self._seen = seen
        self.payload = json.dumps(self.state(), ensure_ascii=False, separators=(",", ":"))
        self.num_built += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    async def events(self) -> AsyncIterator[str]:
        """The page's state as server-sent events: now, then at each change."""
        self._num_pages += 1
        try:
            self.refresh()
            while not self._is_closed:
                changed = self._changed
                yield f"data: {self.payload}\n\n"
                await changed.wait()
        finally:
            self._num_pages -= 1

    # --- the page's state -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"at": time.time(), "started_at": self._started_at, "api_key_required": self._api_key_required,
                "models": [self._model_state(model) for model in self._models],
                "requests_by_api": self._metrics.requests_by_api(),
                "history": list(self._history), "errors": list(self._errors)}

    def _model_state(self, model) -> dict[str, Any]:
        state: dict[str, Any] = {"name": model.name, "status": model.status}
        runner = model.runner
        if runner is None:
            return state | {"failure": model.told_failure}
        snapshot: RunnerSnapshot = runner.latest_snapshot
        stats = snapshot.stats
        return state | {
            "failure": runner.failure, "device": runner.device, "slot_ctx": runner.window,
            "slots": [self._slot_state(slot) for slot in snapshot.slots],
            "queue": [self._queued_state(queued) for queued in snapshot.queue],
            "num_waiting": runner.num_waiting, "num_running": snapshot.num_running,
            "finished": {"succeeded": snapshot.num_succeeded, "failed": snapshot.num_failed,
                         "cancelled": snapshot.num_cancelled},
            "tokens_per_s": snapshot.recent_tokens_per_s, "generated_tokens": stats.generated_tokens,
            "prompt_tokens_computed": stats.prompt_tokens, "prompt_tokens_reused": stats.prompt_tokens_reused,
            "kv": _kv_state(snapshot),
        }

    def _origin(self, request_id: str) -> dict[str, str]:
        origin = self._origins.get(request_id)
        return {"api": "batch", "client": ""} if origin is None else {"api": origin.api, "client": origin.client}

    def _slot_state(self, slot: SlotSnapshot) -> dict[str, Any]:
        state: dict[str, Any] = {"id": slot.slot, "phase": slot.phase, "kv_cells": slot.context_used}
        if slot.request_id is None:
            return state | {"kept_tokens": slot.cached_tokens}
        return state | self._origin(slot.request_id) | {
            "request_id": slot.request_id, "prompt_tokens": slot.prompt_tokens, "cached_tokens": slot.cached_tokens,
            "computed_tokens": max(0, min(slot.context_used, slot.prompt_tokens) - slot.cached_tokens),
            "generated_tokens": slot.generated_tokens, "tokens_per_s": slot.tokens_per_s,
            "text_tail": slot.text_tail, "is_slid": slot.is_slid}

    def _queued_state(self, queued: QueuedSnapshot) -> dict[str, Any]:
        return self._origin(queued.request_id) | {
            "request_id": queued.request_id, "phase": "parked" if queued.is_parked else "queued",
            "prompt_tokens": queued.prompt_tokens, "generated_tokens": queued.generated_tokens,
            "waited_s": queued.waited_s}


def _kv_state(snapshot: RunnerSnapshot) -> dict[str, Any]:
    pool, cache = snapshot.pool, snapshot.host_cache
    used = pool.cells_used if pool else sum(slot.context_used for slot in snapshot.slots)
    state: dict[str, Any] = {"cells_used": used,
                             "cells": pool.size if pool else sum(slot.window for slot in snapshot.slots)}
    if cache is not None and cache.limit_bytes:
        state["ram_cache"] = {"bytes": cache.num_bytes, "limit_bytes": cache.limit_bytes, "entries": cache.num_entries}
    return state


def _histogram_totals(histogram) -> tuple[float, float]:
    """A prometheus_client Histogram's sum and count so far."""
    totals = {sample.name: sample.value for family in histogram.collect() for sample in family.samples
              if sample.name.endswith(("_sum", "_count"))}
    return (next((value for name, value in totals.items() if name.endswith("_sum")), 0.0),
            next((value for name, value in totals.items() if name.endswith("_count")), 0.0))
