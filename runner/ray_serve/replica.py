"""An Engine replica of multiseq.ray_serve: one whole multiseq server (its app, runner and slots)
serving the HTTP calls the gateway hands it, and sharing prompt prefixes' KV with the other
replicas (`Engine.share_prefix`, asked for by a replica that takes a conversation another holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

import numpy as np
from ray import serve

from multiseq.config import RunnerConfig
from multiseq.errors import BackendError
from multiseq.formats.reader import PromptItem
from multiseq.kv.hostcache import SharedPrefix
from multiseq.models import ModelError
from multiseq.ray_serve.calls import ACCEPTED, ENGINE, HttpCall, PrefixAsk, RayServeError
from multiseq.loop.runner import Runner
from multiseq.server.app import ServerSettings, create_app
from multiseq.server.serve import GRACEFUL_SHUTDOWN_SECONDS, prepare_to_serve

logger = logging.getLogger("multiseq.server")

# Prefix KV sharing between replicas: the fewest tokens worth a transfer (a Ray call and a
# restore cost about what a step does), and how often a replica asked for a prefix looks again
# while its prefill is under way.
MIN_SHARED_TOKENS = 64
SHARE_POLL_S = 0.05


# The call an Engine replica's app is serving (set for the app's task; its routes inherit it).
_CALL: ContextVar[HttpCall | None] = ContextVar("multiseq_ray_serve_call", default=None)


class Engine:
    """One multiseq server: its app, its runner, its slots. Calls come as `HttpCall`s; each
    answer is a stream of lists of ASGI messages, after one that names this replica.

    With `share_prefixes`, a request whose prompt starts with more than this replica holds
    brings that prefix's KV from a replica that holds it (`PrefixAsk`, answered by
    `share_prefix`), into host memory, before it is queued: it is restored, not prefilled
    again. A prefill of it under way there is waited for while it goes forward; a transfer
    that fails leaves the request to prefill as it would have."""

    def __init__(self, config: RunnerConfig | list[RunnerConfig], settings: ServerSettings,
                 share_prefixes: bool = True) -> None:
        """`config`: the model's, or each served model's (settings.model_name's, then
        more_models'): every one loads here, each with a runner of its own."""
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        self._app_name = context.app_name
        self._engines = None  # a handle to this deployment, to ask the other replicas (made at first use)
        self._bringing: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        if settings.data_dir is not None:  # each replica its own files and batches (their calls are pinned)
            settings = dataclasses.replace(settings, data_dir=settings.data_dir / f"replica-{context.rank.rank}")
        self.app = create_app(None, settings)
        runners = self._open(config if isinstance(config, list) else [config])
        if share_prefixes and runners[0].can_import_prefixes:  # (the first model's prefixes)
            self.app.state.server.before_submit = self._bring_prefix
        for model, runner in reversed(list(zip(self.app.state.server.models, runners))):
            self.app.state.server.attach(runner, model.name)  # the first last: its batches start then

    def _open(self, configs: list[RunnerConfig]) -> list[Runner]:
        runners: list[Runner] = []
        try:
            for config in configs:
                runners.append(Runner(config))
                prepare_to_serve(runners[-1])
        except (BackendError, ModelError, ValueError, OSError) as error:
            for runner in runners:
                runner.close()
            self.app.state.server.close()
            raise RayServeError(f"the model could not load: {error}") from None  # (the error names its file)
        return runners

    async def handle_http(self, call: HttpCall) -> AsyncIterator[list[dict[str, Any]]]:
        yield [{"type": ACCEPTED, "replica": self.name}]
        exchange = _Exchange(call.body)
        serving = _CALL.set(call)
        task = asyncio.ensure_future(self.app(call.scope(), exchange.receive, exchange.send))
        _CALL.reset(serving)
        task.add_done_callback(lambda _: exchange.finish())
        try:
            while batch := await exchange.next_batch():
                yield batch
        finally:
            exchange.disconnect()  # the caller went away (or the answer is complete): the app's job ends
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), GRACEFUL_SHUTDOWN_SECONDS)

    async def share_prefix(self, ask: PrefixAsk) -> SharedPrefix | None:
        """The KV of the longest prefix of ask.tokens held here, when it is longer than
        ask.more_than; None when there is none. A prefill here that will hold more is waited
        for while it goes forward: it is already part of the way through what the asker would
        compute from the start (a step of a long prefill on a CPU takes seconds, so the asker's
        own cost, not a fixed time, is how long it may go without progress)."""
        server = self.app.state.server
        runner = server.runner
        if runner is None:
            return None
        num_held_before = -1
        asked_at = progressed_at = time.monotonic()
        while True:
            holding = await asyncio.to_thread(runner.prefix_holding, ask.tokens)
            now = time.monotonic()
            if holding.num_held > num_held_before:
                num_held_before, progressed_at = holding.num_held, now
            num_coming = server.num_preparing + runner.num_waiting
            if not ask.keeps_waiting(holding.num_held, holding.is_growing, num_coming, now - asked_at, now - progressed_at):
                break
            await asyncio.sleep(SHARE_POLL_S)
        if not ask.holds_more(holding.num_held):
            return None
        return (await asyncio.to_thread(runner.prefix_holding, ask.tokens, ask.more_than)).shared

    async def _bring_prefix(self, runner: Runner, item: PromptItem) -> None:
        """Before a request is queued: when the router saw another replica hold more of its
        conversation than this one, import the KV of what that replica holds of the prompt."""
        call = _CALL.get()
        if call is None or item.request is None or call.key.is_empty or runner is not self.app.state.server.runner:
            return  # (prefixes are shared for the first model)
        start = call.key.segments[0]  # the conversation's first part: its tools, or its system prompt
        holders = call.hints.get("holders", ())
        held_here = dict(holders).get(self.name, 0)
        donors = [name for name, num_chars in holders if name != self.name and num_chars > held_here]
        if not donors:
            # A request with the same start may be bringing it here (the router counts this
            # replica as holding it from then on): wait, and find it in host memory.
            under_way = self._bringing.get(start)
            if under_way is not None:
                async with under_way:
                    pass
            return
        # One transfer at a time per conversation start: the requests behind it find its
        # prefix here, and ask for nothing.
        lock = self._bringing.setdefault(start, asyncio.Lock())
        try:
            async with lock:
                tokens = np.asarray(await self.app.state.server.offload.prepare(runner.prompt_tokens, item.request),
                                    dtype=np.int64)
                await self._import_from(donors[0], runner, tokens)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a prefix not brought is prefilled here, as without sharing
            logger.warning("replica %s: no prefix from %s (%s)", self.name, donors[0],
                           str(error).splitlines()[0] if str(error) else type(error).__name__)

    async def _import_from(self, donor: str, runner: Runner, tokens: np.ndarray) -> None:
        holding = await asyncio.to_thread(runner.prefix_holding, tokens)
        num_missing = len(tokens) - holding.num_held
        if num_missing < MIN_SHARED_TOKENS:
            return
        started = time.perf_counter()
        ask = PrefixAsk(tokens, holding.num_held + MIN_SHARED_TOKENS - 1, runner.prefill_seconds(num_missing), donor)
        shared = await self._other_engines().share_prefix.remote(ask)
        if shared is not None and await asyncio.to_thread(runner.import_prefix, shared):
            logger.info("replica %s: %d prompt tokens' KV from %s in %.3f s", self.name, len(shared.tokens), donor,
                        time.perf_counter() - started)

    def _other_engines(self):
        if self._engines is None:
            self._engines = serve.get_deployment_handle(ENGINE, self._app_name)
        return self._engines

    def __del__(self) -> None:
        state = getattr(getattr(self, "app", None), "state", None)
        if state is None:
            return
        server = state.server
        server.is_draining = True
        server.close()
        for model in server.models:
            if model.runner is not None:
                model.runner.close()


class _Exchange:
    """An ASGI conversation with the app: the request body, then a disconnect once the caller
    is gone; what the app sends, in batches (each batch one streamed item to the gateway)."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._is_body_read = False
        self._disconnected = asyncio.Event()
        self._messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        if not self._is_body_read:
            self._is_body_read = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self._disconnected.is_set():
            raise OSError("the caller is gone")
        self._messages.put_nowait(message)

    def finish(self) -> None:
        self._messages.put_nowait(None)

    def disconnect(self) -> None:
        self._disconnected.set()

    async def next_batch(self) -> list[dict[str, Any]]:
        """The messages sent since the last batch (waiting for one); empty once the app is done."""
        first = await self._messages.get()
        if first is None:
            return []
        batch = [first]
        while not self._messages.empty():
            message = self._messages.get_nowait()
            if message is None:
                self.finish()  # seen again at the next call, which ends the stream
                break
            batch.append(message)
        return batch
