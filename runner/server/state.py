"""What the routes share: the settings, the served models and their runners (None while one
loads), the metrics, the Batch API's service, and the queue's bound."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..formats.openai_output import response_id
from ..formats.reader import PromptItem
from ..config import OverflowPolicy, SamplingParams
from ..request import Result
from ..loop.runner import Runner
from .batches import BatchRules, BatchService
from .worker import ModelUnavailable
from .errors import INVALID_REQUEST, OVERLOADED, ApiError, PromptTooLong
from .jobs import Job, LoopDispatcher
from .limits import (DEFAULT_IO_THREADS, DEFAULT_KEEP_ALIVE_SECONDS, DEFAULT_MAX_BATCH_LINES,  # noqa: F401 - re-exported
                     DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE, DEFAULT_MAX_UPLOAD_BYTES, DEFAULT_PREPARE_THREADS,
                     DEFAULT_PREPARE_TIMEOUT_SECONDS, DEFAULT_SEND_TIMEOUT_SECONDS, MAX_STREAM_INTERVAL_SECONDS,
                     RETRY_AFTER_SECONDS)
from .metrics import ServerMetrics
from .monitor import Monitor
from .loader import ModelLoader
from .models import ServedModels, ready
from .offload import Offload

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "multiseq"  # the model id /v1/models lists and requests may name (--alias)
    # The models served besides it, each with a runner of its own, picked by a request's `model`.
    more_models: tuple[str, ...] = ()
    models_max: int = 0  # models loaded at once (0: every one); the least recently used idle one goes for another
    model_keep_alive_s: float = math.inf  # a model idle this long is unloaded (a request's keep_alive wins)
    models_memory_bytes: int | None = None  # the process's memory with its models loaded at most (None: no bound)
    model_aliases: tuple[tuple[str, str], ...] = ()  # (alias, model name): more names requests may give a model
    deferred_models: tuple[str, ...] = ()  # models loaded at their first request, not at start (never the first)
    adapter_models: tuple[tuple[str, str], ...] = ()  # (adapter name, base model): --lora-modules, served as models
    api_key: str | None = None  # when set, every route but /health wants `Authorization: Bearer <key>`
    metrics_public: bool = False  # with an api_key, /metrics is open too
    # Host header names besides the bound address and loopback (`*`: any; `*.lan`: a domain).
    allowed_hosts: tuple[str, ...] = ()
    # Web origins whose pages may call the API (`*`: any): CORS headers and preflights for them.
    cors_origins: tuple[str, ...] = ()
    # Chat Completions and Completions fields this server does not know: a 400 naming the field
    # (True), or ignored and named in the x-multiseq-ignored-fields header (False).
    strict_fields: bool = False
    max_queue: int = DEFAULT_MAX_QUEUE  # requests waiting for a slot; beyond that, 503
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    # Sampling of requests that do not say; OpenAI's max_tokens default: what the window leaves.
    defaults: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=None))
    # A request that does not fit its slot is a 400 naming the numbers (never silently slid).
    overflow: OverflowPolicy = OverflowPolicy.REJECT
    # Where the Files and Batch APIs keep files, batches and results (None: those APIs are off).
    data_dir: Path | None = None
    # Where POST /slots/{id}?action=save|restore keeps slots' KV files (None: those actions are off).
    slot_save_path: Path | None = None
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES  # a larger upload gets 413
    max_batch_lines: int = DEFAULT_MAX_BATCH_LINES  # a batch with more requests fails validation
    # Threads that prepare requests (render, tokenize, compile schemas and tool grammars), and
    # that read and write files and the database: apart, so neither waits on the other.
    prepare_threads: int = DEFAULT_PREPARE_THREADS
    io_threads: int = DEFAULT_IO_THREADS
    # A request whose preparation takes longer gets a 400 (or a 503 when it waited for a thread).
    prepare_timeout_s: float = DEFAULT_PREPARE_TIMEOUT_SECONDS
    # A stream whose client reads nothing for this long is cut, and its request cancelled.
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_SECONDS
    # A stream with nothing to send (its request waits for a slot) sends `: keep-alive` this often.
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_SECONDS
    # The loop takes the runner's pieces at most this often (0: every step): with many streams
    # on a fast model, each stream then gets several steps' text in one chunk, one write. None:
    # in proportion to the streams being fed (jobs.MAX_CHUNKS_PER_SECOND over them all).
    stream_interval_s: float | None = None
    webui: bool = True  # GET / serves the page (--no-webui: off; GET /status stays)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "more_models", tuple(self.more_models))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        if min(self.max_queue, self.max_body_bytes, self.max_upload_bytes, self.max_batch_lines,
               self.prepare_threads, self.io_threads) < 1:
            raise ValueError("max_queue, max_body_bytes, max_upload_bytes, max_batch_lines, prepare_threads and "
                             "io_threads must be >= 1")
        if min(self.prepare_timeout_s, self.send_timeout_s, self.keep_alive_s) <= 0:
            raise ValueError("prepare_timeout_s, send_timeout_s and keep_alive_s must be > 0")
        if self.stream_interval_s is not None and not 0 <= self.stream_interval_s <= MAX_STREAM_INTERVAL_SECONDS:
            raise ValueError(f"stream_interval_s must be between 0 and {MAX_STREAM_INTERVAL_SECONDS}")


class ServerState:
    """What the routes share: the models and their runners, settings, metrics."""

    def __init__(self, runner: Runner | None, settings: ServerSettings) -> None:
        self.models = ServedModels([settings.model_name, *settings.more_models], dict(settings.model_aliases),
                                   dict(settings.adapter_models))
        self.models.default.runner = runner
        self.settings = settings
        self.metrics = ServerMetrics(lambda: self.runner, lambda: self.models)
        self.monitor = Monitor(self.models, self.metrics, settings.api_key is not None)  # what the page shows
        self.offload = Offload(settings.prepare_threads, settings.io_threads, settings.prepare_timeout_s)
        # StoreError when the data directory cannot be used.
        self.batches = None if settings.data_dir is None else BatchService(settings.data_dir, BatchRules(
            settings.model_name, settings.defaults, settings.overflow, settings.max_batch_lines, self._served_name))
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once batches start
        # Choices accepted but not yet handed to the runner (it counts them from then on).
        self._num_dispatching = 0
        self._num_awaiting_loads = 0  # requests waiting for their model to load (bounded by max_queue)
        self._dispatch_lock = threading.Lock()
        self._dispatchers: dict[int, LoopDispatcher] = {}  # by runner: its events to the serving loop
        self.is_draining = False
        # Awaited before a request's choices are prepared and queued (a replica brings the KV
        # of the prompt's prefix from another replica here); it must not raise for its own failures.
        self.before_submit: Callable[[Runner, PromptItem], Awaitable[None]] | None = None
        self.loader: ModelLoader | None = None  # loads and unloads the models (`multiseq serve`'s)

    @property
    def num_preparing(self) -> int:
        """Choices accepted and not yet handed to the runner (being prepared, or waiting for a
        thread to prepare them)."""
        return self._num_dispatching

    def _count_dispatching(self, change: int) -> None:
        with self._dispatch_lock:
            self._num_dispatching += change

    @property
    def runner(self) -> Runner | None:
        """The default model's runner (None while it loads)."""
        return self.models.default.runner

    def attach(self, runner: Runner, name: str | None = None) -> None:
        """A model has loaded (the default one unless named): its requests are served, and (the
        default's) batches run, from now on."""
        model = self.models.default if name is None else self.models.pick(name)
        model.runner = runner
        if model is self.models.default:
            self.start_batches()

    def start_batches(self) -> None:
        """Run batches once there is a runner (an app made with one starts them at the first
        Files or Batch API request; `multiseq serve` as soon as the model has loaded)."""
        if self.batches is not None and self.runner is not None and not self.is_draining:
            with contextlib.suppress(RuntimeError):  # (attached outside a loop: Ray's replica; one model)
                self._loop = asyncio.get_running_loop()
            self.batches.start(self.runner, self._batch_runner)

    def _served_name(self, name: str) -> str | None:
        model = self.models.named(name)
        return None if model is None else model.name

    def _batch_runner(self, name: str) -> Runner:
        """The runner of the model a batch names, loaded for it when it is not (called on the
        batch worker's thread; ModelUnavailable, saying why, when it cannot load)."""
        model = self.models.named(name) or self.models.default
        if model.runner is None and self.loader is not None and self._loop is not None:
            with contextlib.suppress(ApiError):  # ready() below says why
                asyncio.run_coroutine_threadsafe(self.loader.ensure_loaded(model), self._loop).result()
        try:
            return ready(model)
        except ApiError as error:
            raise ModelUnavailable(error.message) from None

    def begin_shutdown(self) -> None:
        """Stop taking requests and end the running ones (their streams end cleanly). Batch
        work stops first, so no new line takes a slot; its cancelled lines run again next time."""
        self.is_draining = True
        self.monitor.close()  # the pages' streams end: a shutdown waits for no page
        if self.batches is not None:
            self.batches.stop()
        for model in self.models:
            if model.runner is not None:
                model.runner.cancel_all_soon()  # on the event loop: never wait for the engine

    def close(self) -> None:
        """After the server has stopped, before the runner closes: wait for the batch worker
        (its cancelled requests end at the runner's next step) and close the database."""
        if self.batches is not None:
            self.batches.close()
        self.offload.shutdown()
        for dispatcher in self._dispatchers.values():
            dispatcher.close()
        self._dispatchers = {}

    def dispatcher(self, runner: Runner, loop: asyncio.AbstractEventLoop) -> LoopDispatcher:
        """The one dispatcher that hands `runner`'s events to `loop` (made at its first request)."""
        current = self._dispatchers.get(id(runner))
        if current is None or current.runner is not runner or current.loop is not loop:
            if current is not None:
                current.close()
            current = self._dispatchers[id(runner)] = LoopDispatcher(runner, loop, self.settings.stream_interval_s)
        return current

    def ready_runner(self) -> Runner:
        """The default model's runner as it is now (never loads it), or a 503 saying why it cannot serve."""
        self._check_not_draining()
        return ready(self.models.default)

    async def runner_for(self, name: Any, keep_alive_s: float | None = None) -> tuple[Runner, str]:
        """The runner of the model a request names (None: the default), loaded first if it is
        not, and the model's name; a 404 when no such model is served, a 503 when it cannot
        serve now. keep_alive_s: how long it stays loaded once idle (None: the server's default)."""
        self._check_not_draining()
        model = self.models.pick(name)
        if self.loader is not None and model.runner is None:
            await self._await_load(model)
            self._check_not_draining()
        model.keep_alive_s = self.settings.model_keep_alive_s if keep_alive_s is None else keep_alive_s
        return ready(model), self.models.adapter_of(name) or model.name  # an adapter answers as itself

    async def _await_load(self, model) -> None:
        """Wait for the model's load, among at most --max-queue requests waiting for loads (a
        503 beyond: a flood of requests for a model that loads holds no more than the queue)."""
        if self._num_awaiting_loads >= self.settings.max_queue:
            raise ApiError(503, f"The server is busy: {self._num_awaiting_loads} requests are waiting for models to "
                                f"load. Retry later.", OVERLOADED, code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self._num_awaiting_loads += 1
        try:
            await self.loader.ensure_loaded(model)
        finally:
            self._num_awaiting_loads -= 1

    def _check_not_draining(self) -> None:
        if self.is_draining:
            raise ApiError(503, "The server is shutting down.", OVERLOADED, code="shutting_down")

    def forget_runner(self, runner: Runner) -> None:
        """An unloaded model's closed runner (on the loop): what it delivered last is handed to
        its requests, then its dispatcher goes."""
        dispatcher = self._dispatchers.pop(id(runner), None)
        if dispatcher is not None:
            dispatcher.close(take_held=True)

    def check_model(self, name: Any) -> None:
        """A 404 when the server serves no model of that name (None names the default)."""
        self.models.pick(name)

    async def submit(self, runner: Runner, item: PromptItem, streams: bool = True) -> Job:
        """Queue a request's choices, or 503 when the queue is full. Tokenizing runs in the
        prepare pool, so a long prompt never stalls other clients' streams."""
        if item.n > self.settings.max_queue:  # it could never be queued: busy is no answer
            raise ApiError(400, f"'n' is {item.n}, more choices than this server's queue holds "
                                f"({self.settings.max_queue}); ask for at most {self.settings.max_queue}.",
                           INVALID_REQUEST, "n")
        waiting = runner.num_waiting + self._num_dispatching
        if waiting + item.n > self.settings.max_queue and self.batches is not None:
            waiting -= self.batches.num_waiting_lines(runner)  # the queue limit is for interactive requests
        if waiting + item.n > self.settings.max_queue:
            raise ApiError(503, f"The server is busy: {waiting} requests are waiting for a slot (at most "
                                f"{self.settings.max_queue}). Retry later.", OVERLOADED, code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        job = Job(runner, item, self.dispatcher(runner, asyncio.get_running_loop()), response_id(item.is_chat),
                  streams)
        self.monitor.note_submitted(job.request_ids)
        self._count_dispatching(item.n)

        def undo(_) -> None:  # the client was told it timed out: what was queued meanwhile goes
            self._count_dispatching(-(item.n - job.num_dispatched))
            job.cancel()

        try:
            if self.before_submit is not None:
                await self.before_submit(runner, item)
            await self.offload.prepare(job.submit, lambda: self._count_dispatching(-1), on_abandoned=undo)
        except ApiError as error:
            if error.code != "prepare_timeout":  # else the work goes on, and undo() counts the rest
                self._count_dispatching(-(item.n - job.num_dispatched))
            raise
        except BaseException:
            self._count_dispatching(-(item.n - job.num_dispatched))
            raise
        if self.is_draining:  # the shutdown's cancel_all came before this request was queued
            job.cancel()
            self.ready_runner()
        refused = job.rejection()
        if refused is not None:
            raise _refusal(refused, item, runner.window)
        return job


def _refusal(refused: Result, item: PromptItem, window: int) -> ApiError:
    """The 400 for a request the runner refused outright; a prompt that does not fit its slot
    says so in numbers as well as words."""
    too_long = PromptTooLong(refused.prompt_tokens, window - 1) if refused.prompt_tokens else None
    return ApiError(400, refused.error or "the request cannot run", INVALID_REQUEST,
                    "messages" if item.is_chat else "prompt",
                    "context_length_exceeded" if too_long is not None else None, prompt_too_long=too_long)
