"""Serving on a Ray cluster: N replicas of the multiseq server behind Ray Serve's HTTP proxy,
each conversation routed to the replica that holds it.

    pip install 'multiseq[ray]'
    multiseq serve --ray auto --replicas 2 -m smollm2-135m -np 4 -t 4

Two deployments make one Ray Serve application (`build_app`; `run()` runs it for the command):

- `Engine`: a whole `multiseq serve` per replica (the app `multiseq.server` builds, with its own
  Runner and slots), its requests handed over as HTTP calls and its ASGI messages streamed back.
  Each asks Ray for as many CPUs as its llama.cpp threads (and the GPUs it is given).
- `Gateway`, the ingress behind Ray Serve's proxy: reads each request's body, works out its
  routing key (`multiseq.server.routing`) and calls an Engine replica through a deployment
  handle, whose request router picks the replica: `PrefixAffinityRouter` (the conversation's
  replica unless it is far busier; `--routing prefix`) or `LeastBusyRouter` (Ray Serve's own
  power of two choices; `--routing ray`). The proxy itself cannot route by prefix: it never
  reads the body. The gateway names the replica in the `x-multiseq-replica` header, answers
  /health and /metrics for all replicas (one label per replica), and ends a stream whose
  replica died with the API's error event: the replica is restarted by Ray Serve, new requests
  go to the others meanwhile, and a request refused by a dead replica before it started is sent
  to another.

Both routers also send a call to one named replica (the gateway's /health and /metrics ask each
one), and keep a directory of the replicas in this process for that.

Prefixes shared between replicas (`share_prefixes`, on with prefix routing): as the router picks
a replica it notes in the call which replicas were sent most of its key. The replica that takes
a call whose prompt another replica holds more of asks that one for the prefix's KV
(`Engine.share_prefix`: a slot's state, or one in host memory, waiting for a prefill of it under
way) and adds it to its own host memory before the request is queued; the request then restores
it as it restores a state saved there. Sessions that spread over the replicas compute their
shared system prompt once, and a turn sent away from its busy home brings its conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import re
import signal
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

try:
    from ray import serve
    from ray.exceptions import RayError
    # Ray Serve's default router, not exported by ray.serve.request_router (Ray LLM's prefix
    # router builds on it from here too).
    from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
    from ray.serve.config import HTTPOptions, RequestRouterConfig
    from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
except ImportError as error:  # the optional extra is missing
    raise ImportError("multiseq.ray_serve needs Ray Serve: pip install 'multiseq[ray]'") from error

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import JSONResponse, Response

from multiseq import ray as multiseq_ray
from multiseq.config import RunnerConfig
from multiseq.errors import BackendError
from multiseq.formats.reader import PromptItem
from multiseq.hostcache import SharedPrefix
from multiseq.models import ModelError
from multiseq.runner import Runner
from multiseq.server.app import ServerSettings, create_app
from multiseq.server.errors import SERVER_ERROR, error_body
from multiseq.server.messages import stream_error_event
from multiseq.server.routing import (NO_KEY, NO_MATCH, ROUTINGS, Candidate, LoadBook, PrefixIndex, PrefixMatch,
                                     RoutingKey, StateHomes, rank_replicas, response_key, routing_key)
from multiseq.server.serve import GRACEFUL_SHUTDOWN_SECONDS, prepare_to_serve
from multiseq.server.sse import sse

logger = logging.getLogger("multiseq.server")

APP_NAME = "multiseq"
ENGINE = "Engine"
GATEWAY = "Gateway"
REPLICA_HEADER = b"x-multiseq-replica"
# What an Engine replica takes at once beyond its queue (the server's own limits answer first).
ENGINE_EXTRA_ONGOING = 64
# The gateway only relays (each engine's queue bounds the work): Ray Serve's default of 5 at once
# would queue streams in front of it.
GATEWAY_MAX_ONGOING = 100_000
# A call refused by a dead replica before it started is sent to another this many times.
MAX_SEND_ATTEMPTS = 3
# Prefix KV sharing between replicas: the replicas named as holders of a request's key, the
# fewest tokens worth a transfer (a Ray call and a restore cost about what a step does), and how
# often a replica asked for a prefix looks again while its prefill is under way.
MAX_HOLDERS_NAMED = 3
MIN_SHARED_TOKENS = 64
SHARE_POLL_S = 0.05
# How long a replica asked for a prefix it neither holds nor prefills waits for requests it is
# still preparing (rendering, tokenizing): the one with that prefix may be among them.
SHARE_GRACE_S = 0.5
# How often Ray Serve checks a replica: a dead one is found, and replaced, this soon.
HEALTH_CHECK_PERIOD_S = 2.0
# How long /health and /metrics wait for a replica, and for the first replica to be known.
FAN_OUT_TIMEOUT_S = 3.0
# The first message of a replica's answer: who took the call (then the app's ASGI messages).
_ACCEPTED = "multiseq.accepted"
REPLICA_LOST = ("The replica serving this request stopped before it finished (Ray Serve restarts it); "
                "send the request again.")
_SEQUENCE_NUMBER = re.compile(rb'"sequence_number":\s*(\d+)')
_RESPONSE_ID = re.compile(rb'"id":\s*"(resp_[A-Za-z0-9_-]+)"')


class RayServeError(Exception):
    """Ray Serve could not start the application: one line for the user."""


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request as the gateway hands it to an Engine replica (what the router reads)."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    key: RoutingKey = NO_KEY
    replica: str | None = None  # a call for this replica only (health, metrics)
    client: tuple[str, int] | None = None
    # What the router notes as it picks the replica (Ray Serve sends the call's arguments once
    # one is picked): "holders", the replicas sent most of the key, with how many of its
    # characters; the replica that takes the call brings the prompt's prefix KV from one holding more.
    hints: dict[str, Any] = field(default_factory=dict, compare=False)

    def scope(self) -> dict[str, Any]:
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                "method": self.method, "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
                "query_string": self.query_string, "root_path": "", "headers": list(self.headers),
                "client": self.client, "server": None}


@dataclass(frozen=True)
class PrefixAsk:
    """One Engine replica asking another for the KV of the longest prefix of `tokens` it holds,
    if longer than `more_than`; a prefill of it under way there is waited for while it goes
    forward at least every `patience_s` (what computing the prefix itself would take)."""

    tokens: np.ndarray
    more_than: int
    patience_s: float
    replica: str  # the replica asked (the routers send the call there)
    key: RoutingKey = NO_KEY  # none: the routers read a call's key and replica

    def holds_more(self, num_held: int) -> bool:
        return num_held > self.more_than


# --- routing -------------------------------------------------------------------------------------

# The routers of this process, by (application, deployment): the gateway asks them which
# replicas there are (a deployment handle's router lives in the process that holds the handle).
_ROUTERS: dict[tuple[str, str], "_ReplicaDirectory"] = {}


def _call_of(pending_request: PendingRequest | None) -> HttpCall | None:
    """The HttpCall a pending request carries. (Told by its fields: Ray Serve ships a router's
    module to the router by value, so the router's HttpCall is a copy of the class.)"""
    if pending_request is None or not pending_request.args:
        return None
    call = pending_request.args[0]
    return call if hasattr(call, "key") and hasattr(call, "replica") else None


class _ReplicaDirectory:
    """What both routers add to their policy: the replicas known here (for the gateway), calls
    for one named replica, and the homes of pinned state (the Files and Batch APIs' data, stored
    responses), which every request naming it goes to. The router's own loop and the gateway's
    share this state: one lock."""

    def _register(self) -> None:
        # Ray Serve ships a router's module by value (a copy of its globals): the directory the
        # gateway reads is the imported module's.
        import multiseq.ray_serve as imported

        self._lock = threading.Lock()
        self.homes = StateHomes()
        imported._ROUTERS[(self._deployment_id.app_name, self._deployment_id.name)] = self

    def replica_names(self) -> list[str]:
        return sorted(replica_id.unique_id for replica_id in list(self.curr_replicas))

    def note(self, key: RoutingKey, replica: str) -> None:
        """`replica` now holds the state under `key` (a stored response): calls naming it go there."""
        with self._lock:
            self.homes.note(key, replica)

    def _fixed_choice(self, candidates: list[RunningReplica],
                      pending_request: PendingRequest | None) -> list[list[RunningReplica]] | None:
        """The replica a call must go to, if it must: the one it names, or its state's home."""
        call = _call_of(pending_request)
        if call is None:
            return None
        with self._lock:
            wanted = call.replica if call.replica is not None else self.homes.home_of(call.key)
        chosen = [replica for replica in candidates if replica.replica_id.unique_id == wanted]
        if call.replica is None and not chosen:
            return None
        pending_request.routing_context.should_backoff = True  # the only choice: wait before asking it again
        return [chosen]

    def _note_routed(self, call: HttpCall | None, replica: str) -> None:
        if call is not None and call.replica is None:
            self.note(call.key, replica)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.replica_names()) - {replica.replica_id.unique_id for replica in replicas}
        super().update_replicas(replicas)
        for name in gone:
            self._forget(name)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def _forget(self, name: str) -> None:
        with self._lock:
            self.homes.forget(name)


class LeastBusyRouter(_ReplicaDirectory, PowerOfTwoChoicesRequestRouter):
    """Ray Serve's default router (power of two choices), for `--routing ray`; pinned state
    still goes to its home. A replica chosen goes to the request it was chosen for (Ray's base
    rule), not to the oldest one waiting (its FIFO mixin's), which would send a call meant for
    one replica to another."""

    _fulfill_next_pending_request = RequestRouter._fulfill_next_pending_request

    def initialize_state(self, **kwargs: Any) -> None:
        self._register()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        fixed = self._fixed_choice(candidate_replicas, pending_request)
        if fixed is not None:
            return fixed
        return await super().choose_replicas(candidate_replicas, pending_request)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._note_routed(_call_of(pending_request), replica_id.unique_id)


def _most_held(matches: dict[str, PrefixMatch]) -> tuple[tuple[str, int], ...]:
    """The replicas holding most of a key, with how many of its characters, most first."""
    ranked = sorted(matches.items(), key=lambda item: -item[1].num_held_chars)
    return tuple((name, match.num_held_chars) for name, match in ranked[:MAX_HOLDERS_NAMED])


class PrefixAffinityRouter(_ReplicaDirectory, RequestRouter):
    """Each request to the replica holding the conversation it continues, unless that replica
    has more than `max_imbalance` requests beyond the least busy one (`rank_replicas`). Its
    in-flight counts are its own (exact while the gateway runs as one replica: every request of
    the deployment then passes this router)."""

    def initialize_state(self, max_imbalance: int = 4, max_nodes: int | None = None) -> None:
        self._register()
        self.max_imbalance = max_imbalance
        self.index = PrefixIndex(max_nodes) if max_nodes else PrefixIndex()
        self.load = LoadBook()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        fixed = self._fixed_choice(candidate_replicas, pending_request)
        if fixed is not None:
            return fixed
        call = _call_of(pending_request)
        key = call.key if call is not None else NO_KEY
        shuffled = random.sample(candidate_replicas, len(candidate_replicas))  # equal ones: any order
        by_name = {replica.replica_id.unique_id: replica for replica in shuffled}
        with self._lock:
            matches = self.index.match(key) if not key.is_empty else {}
            candidates = [Candidate(name, self.load.num_ongoing(name), matches.get(name, NO_MATCH),
                                    self.index.num_conversations(name)) for name in by_name]
            ranked = rank_replicas(candidates, self.max_imbalance)
            if pending_request is not None and ranked:
                self.load.pick(pending_request.metadata.internal_request_id, ranked[0])
            if call is not None and ranked and not key.is_empty and not key.is_pinned:
                call.hints["holders"] = _most_held(matches)
                # Noted now, not once the replica took it: requests that arrive together are
                # routed before any is sent, and each must see where the others went.
                self.index.record(key, ranked[0])
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every replica is offered: wait before again
        return [[by_name[name]] for name in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        name = replica_id.unique_id
        call = _call_of(pending_request)
        self._note_routed(call, name)
        with self._lock:
            self.load.confirm(pending_request.metadata.internal_request_id, name)
            if call is not None and call.replica is None and not call.key.is_empty and not call.key.is_pinned:
                self.index.record(call.key, name)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        with self._lock:
            self.load.finish(internal_request_id)

    def _forget(self, name: str) -> None:
        super()._forget(name)
        with self._lock:
            self.load.forget(name)
            self.index.forget(name)


# --- an Engine replica ---------------------------------------------------------------------------

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

    def __init__(self, config: RunnerConfig, settings: ServerSettings, share_prefixes: bool = True) -> None:
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        self._app_name = context.app_name
        self._engines = None  # a handle to this deployment, to ask the other replicas (made at first use)
        self._bringing: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        if settings.data_dir is not None:  # each replica its own files and batches (their calls are pinned)
            settings = dataclasses.replace(settings, data_dir=settings.data_dir / f"replica-{context.rank.rank}")
        self.app = create_app(None, settings)
        try:
            runner = Runner(config)
        except (BackendError, ModelError, ValueError, OSError) as error:
            self.app.state.server.close()
            raise RayServeError(f"the model could not load: {error}") from None
        prepare_to_serve(runner)
        if share_prefixes and runner.can_import_prefixes:
            self.app.state.server.before_submit = self._bring_prefix
        self.app.state.server.attach(runner)

    async def handle_http(self, call: HttpCall) -> AsyncIterator[list[dict[str, Any]]]:
        yield [{"type": _ACCEPTED, "replica": self.name}]
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
            if holding.is_growing:
                if now - progressed_at >= ask.patience_s:
                    break
            # Requests that came together: the one routed here may still be being prepared.
            elif not (server.num_preparing + runner.num_waiting and now - asked_at < SHARE_GRACE_S):
                break
            await asyncio.sleep(SHARE_POLL_S)
        if not ask.holds_more(holding.num_held):
            return None
        return (await asyncio.to_thread(runner.prefix_holding, ask.tokens, ask.more_than)).shared

    async def _bring_prefix(self, runner: Runner, item: PromptItem) -> None:
        """Before a request is queued: when the router saw another replica hold more of its
        conversation than this one, import the KV of what that replica holds of the prompt."""
        call = _CALL.get()
        if call is None or item.request is None or call.key.is_empty:
            return
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
                tokens = np.asarray(await self.app.state.server.pools.prepare(runner.prompt_tokens, item.request),
                                    dtype=np.int32)
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
        if server.runner is not None:
            server.runner.close()


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

# --- the gateway ---------------------------------------------------------------------------------

class Gateway:
    """The ASGI app behind Ray Serve's proxy: every request to an Engine replica through the
    deployment handle (its router picks which), /health and /metrics over all of them."""

    def __init__(self, engine, max_body_bytes: int, num_replicas: int) -> None:
        self._engine = engine  # a DeploymentHandle of the Engine deployment
        self._max_body_bytes = max_body_bytes
        self._num_replicas = num_replicas

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/health":
            response = await self._health(scope)
        elif scope["method"] == "GET" and scope["path"] == "/metrics":
            response = await self._metrics(scope)
        else:
            await self._forward(scope, receive, send)
            return
        await response(scope, receive, send)

    # --- one request, one replica ---

    async def _forward(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        body = await _read_body(receive, self._max_body_bytes)
        if body is None:
            await _error_response(scope["path"], 413, f"The request body is larger than this server's limit of "
                                                      f"{self._max_body_bytes} bytes.", "request_too_large")(
                scope, receive, send)
            return
        call = HttpCall(scope["method"], scope["path"], scope.get("query_string", b""),
                        tuple((bytes(name), bytes(value)) for name, value in scope.get("headers", [])), body,
                        routing_key(scope["method"], scope["path"], body), client=_client_of(scope))
        relay = _Relay(send, scope["path"])
        for attempt in range(1, MAX_SEND_ATTEMPTS + 1):
            answer = self._engine.options(stream=True).handle_http.remote(call)
            try:
                async for batch in answer:
                    await relay.forward(batch)
                break
            except RayError as error:
                if relay.replica is None and attempt < MAX_SEND_ATTEMPTS:
                    continue  # no replica took it (the chosen one had died): another will
                logger.warning("replica %s failed during %s %s: %s", relay.replica, call.method, call.path,
                               str(error).splitlines()[0] if str(error) else type(error).__name__)
                await relay.fail()
                return
            finally:
                if not relay.is_complete:
                    answer.cancel()  # the client went away, or the replica failed: its job ends
        if relay.response_id is not None and relay.replica is not None:
            router = _router_of(self._engine)
            if router is not None:
                router.note(response_key(relay.response_id), relay.replica)

    # --- all replicas ---

    async def _replica_names(self) -> list[str]:
        """The replicas the router knows (asking one replica first when it knows none yet: a
        handle's router starts with its first call)."""
        router = _router_of(self._engine)
        if router is None or not router.replica_names():
            with contextlib.suppress(asyncio.TimeoutError, RayError):
                await asyncio.wait_for(self._ask(None, "/health", ()), FAN_OUT_TIMEOUT_S)
            router = _router_of(self._engine)
        return router.replica_names() if router is not None else []

    async def _ask(self, replica: str | None, path: str, headers: tuple) -> _Answer | None:
        """GET `path` of one replica (None: any), whole; None when it did not answer."""
        call = HttpCall("GET", path, b"", headers, b"", replica=replica)
        relay = _Collector()
        try:
            async for batch in self._engine.options(stream=True).handle_http.remote(call):
                relay.take(batch)
        except RayError:
            return None
        return relay.answer()

    async def _ask_all(self, path: str, scope: dict[str, Any]) -> dict[str, _Answer | None]:
        """Each replica's answer, one replica after the other: the calls a request makes share
        its Ray Serve request id, and the router matches replicas to calls by that id."""
        headers = tuple((bytes(name), bytes(value)) for name, value in scope.get("headers", []))
        answers = {}
        for name in await self._replica_names():
            try:
                answers[name] = await asyncio.wait_for(self._ask(name, path, headers), FAN_OUT_TIMEOUT_S)
            except asyncio.TimeoutError:
                answers[name] = None
        return answers

    async def _health(self, scope: dict[str, Any]) -> Response:
        answers = await self._ask_all("/health", scope)
        report = health_report({name: None if answer is None else answer.json_status()
                                for name, answer in answers.items()}, self._num_replicas)
        return JSONResponse(report, status_code=200 if report["status"] in ("ok", "degraded") else 503)

    async def _metrics(self, scope: dict[str, Any]) -> Response:
        answers = await self._ask_all("/metrics", scope)
        refused = next((answer for answer in answers.values() if answer is not None and answer.status != 200), None)
        if refused is not None:  # no key, a wrong key: the replicas' own answer
            return Response(refused.body, status_code=refused.status, headers=refused.headers)
        texts = {name: None if answer is None else answer.body.decode() for name, answer in answers.items()}
        return Response(merge_metrics(texts), media_type=CONTENT_TYPE_LATEST)


def _router_of(engine) -> _ReplicaDirectory | None:
    return _ROUTERS.get((engine.app_name, engine.deployment_name))


def _client_of(scope: dict[str, Any]) -> tuple[str, int] | None:
    client = scope.get("client")
    return (str(client[0]), int(client[1])) if client else None


async def _lifespan(receive: Callable, send: Callable) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Callable, limit: int) -> bytes | None:
    """The whole body (the routing key is in it), or None past `limit` bytes."""
    data = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return bytes(data)
        data += message.get("body", b"")
        if len(data) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(data)


def _error_response(path: str, status: int, message: str, code: str) -> JSONResponse:
    """An error in the shape of the API at `path` (Anthropic's for /v1/messages)."""
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": "api_error" if status >= 500 else "invalid_request_error",
                                           "message": message}}
    else:
        body = error_body(message, SERVER_ERROR if status >= 500 else "invalid_request_error", code=code)
    return JSONResponse(body, status_code=status)


class _Relay:
    """A replica's answer on its way to the client: the replica named in a header, and what a
    stream needs to be ended properly if the replica dies halfway (the API's error event)."""

    def __init__(self, send: Callable, path: str) -> None:
        self._send = send
        self._path = path
        self.replica: str | None = None
        self.is_started = False
        self.is_complete = False
        self._is_event_stream = False
        self._last_sequence_number = -1
        self.response_id: str | None = None

    async def forward(self, batch: list[dict[str, Any]]) -> None:
        for message in batch:
            if message["type"] == _ACCEPTED:
                self.replica = message["replica"]
                continue
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                self._is_event_stream = any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                                            for name, value in headers)
                message = {**message, "headers": [*headers, (REPLICA_HEADER, (self.replica or "").encode())]}
                self.is_started = True
            elif message["type"] == "http.response.body":
                self._note(message.get("body", b""))
                self.is_complete = not message.get("more_body", False)
            await self._send(message)

    def _note(self, body: bytes) -> None:
        if self._path == "/v1/responses":
            if self.response_id is None and (found := _RESPONSE_ID.search(body)):
                self.response_id = found.group(1).decode()
            numbers = _SEQUENCE_NUMBER.findall(body)
            if numbers:
                self._last_sequence_number = int(numbers[-1])

    async def fail(self) -> None:
        """The replica died: a 502, or (once the status went out) the stream's error event."""
        if not self.is_started:
            response = _error_response(self._path, 502, REPLICA_LOST, "replica_lost")
            await response({"type": "http"}, _no_receive, self._send)
        else:
            tail = self._error_event() if self._is_event_stream else ""
            await self._send({"type": "http.response.body", "body": tail.encode(), "more_body": False})
        self.is_complete = True

    def _error_event(self) -> str:
        if self._path.startswith("/v1/messages"):
            return stream_error_event(error_body(REPLICA_LOST, SERVER_ERROR, code="replica_lost"))
        if self._path == "/v1/responses":
            return sse({"type": "error", "code": "replica_lost", "message": REPLICA_LOST, "param": None,
                        "sequence_number": self._last_sequence_number + 1}, "error")
        return sse(error_body(REPLICA_LOST, SERVER_ERROR, code="replica_lost")) + sse("[DONE]")


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json_status(self) -> str:
        """The `status` of a /health answer ("ok", "loading", "shutting down", ...)."""
        try:
            return str(json.loads(self.body).get("status", self.status))
        except (ValueError, AttributeError):
            return str(self.status)


class _Collector:
    """A whole answer, gathered."""

    def __init__(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()

    def take(self, batch: list[dict[str, Any]]) -> None:
        for message in batch:
            if message["type"] == "http.response.start":
                self._status = message["status"]
                self._headers = {name.decode("latin-1"): value.decode("latin-1")
                                 for name, value in message.get("headers", []) if name.lower() != b"content-length"}
            elif message["type"] == "http.response.body":
                self._body += message.get("body", b"")

    def answer(self) -> _Answer:
        return _Answer(self._status, self._headers, bytes(self._body))


# --- /health and /metrics over the replicas ------------------------------------------------------

def health_report(statuses: dict[str, str | None], num_replicas: int) -> dict[str, Any]:
    """/health of the whole: "ok" when all `num_replicas` replicas are, "degraded" when some
    are (requests still run; a replica being restarted is missing), "loading" before any replica
    is up, else "unavailable"; and each running replica's own status (None: it did not answer)."""
    replicas = {name: {"status": status or "unreachable"} for name, status in sorted(statuses.items())}
    num_ok = sum(status == "ok" for status in statuses.values())
    if not statuses:
        overall = "loading"
    elif num_ok >= num_replicas:
        overall = "ok"
    else:
        overall = "degraded" if num_ok else "unavailable"
    return {"status": overall, "num_replicas": num_replicas, "replicas": replicas}


def merge_metrics(texts: dict[str, str | None]) -> bytes:
    """The replicas' /metrics as one exposition: every sample labelled with its replica, each
    family once; and multiseq_replica_up per replica (0: it did not answer)."""
    from prometheus_client.core import GaugeMetricFamily, Metric

    families: dict[str, Metric] = {}
    up = GaugeMetricFamily("multiseq_replica_up", "Whether the replica answered this scrape", labels=["replica"])
    for replica, text in sorted(texts.items()):
        up.add_metric([replica], 0 if text is None else 1)
        for family in text_string_to_metric_families(text or ""):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            merged.samples += [sample._replace(labels={**sample.labels, "replica": replica})
                               for sample in family.samples]
    registry = CollectorRegistry()
    registry.register(_Families([up, *families.values()]))
    return generate_latest(registry)


class _Families:
    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self):
        return iter(self._families)


# --- the application -----------------------------------------------------------------------------

class _GatewayDeployment:
    def __init__(self, engine, max_body_bytes: int, num_replicas: int) -> None:
        self.gateway = Gateway(engine, max_body_bytes, num_replicas)

    def __serve_build_asgi_app__(self) -> Gateway:
        return self.gateway


def build_app(config: RunnerConfig, settings: ServerSettings, replicas: int, routing: str = "prefix",
              gpus: float = 0, max_imbalance: int | None = None, share_prefixes: bool = True):
    """The Ray Serve application: `replicas` Engine replicas (each a server with `config` and
    `settings`, asking Ray for config.threads CPUs and `gpus` GPUs) behind the Gateway. Run it
    with `serve.run(app, route_prefix="/")`, or compose it into an application of your own.
    `routing`: "prefix" (the conversation's replica unless it has more than `max_imbalance`
    requests beyond the least busy one; default: its slots, -np) or "ray" (Ray Serve's power of
    two choices). With prefix routing and `share_prefixes`, a replica that takes a prompt whose
    prefix another replica holds brings that prefix's KV over instead of prefilling it (host
    memory must be on: config.cache_ram_mib)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    router = (RequestRouterConfig(request_router_class=PrefixAffinityRouter, request_router_kwargs={
        "max_imbalance": config.parallel if max_imbalance is None else max_imbalance})
        if routing == "prefix" else RequestRouterConfig(request_router_class=LeastBusyRouter))
    engine = serve.deployment(
        Engine, name=ENGINE, num_replicas=replicas,
        ray_actor_options={"num_cpus": config.threads, "num_gpus": gpus},
        max_ongoing_requests=settings.max_queue + config.parallel + ENGINE_EXTRA_ONGOING,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_SECONDS, max_constructor_retry_count=1,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        request_router_config=router)
    gateway = serve.deployment(serve.ingress()(_GatewayDeployment), name=GATEWAY, num_replicas=1,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=GATEWAY_MAX_ONGOING)
    engines = engine.bind(config, settings, share_prefixes and routing == "prefix")
    return gateway.bind(engines, max(settings.max_body_bytes, settings.max_upload_bytes), replicas)


def run(config: RunnerConfig, settings: ServerSettings, replicas: int, address: str | None, host: str, port: int,
        routing: str = "prefix", gpus: float = 0, on_ready: Callable[[str], None] | None = None,
        share_prefixes: bool = True) -> None:
    """`multiseq serve --ray`: join the cluster at `address` (None: start a local one), run the
    application with Ray Serve's proxy on host:port, and keep it until SIGINT or SIGTERM; then
    delete it (and stop the local cluster). RayError or RayServeError: one line for the user."""
    multiseq_ray.connect(address)
    multiseq_ray.check_cpus(replicas, config.threads, gpus, option="--replicas")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options=HTTPOptions(host=host, port=port))
        start_application(build_app(config, settings, replicas, routing, gpus, share_prefixes=share_prefixes))
        if on_ready is not None:
            on_ready(f"http://{host}:{port}")
        while not stop.wait(0.5):  # a wait without a timeout would not wake for the signal handler
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(Exception):
            serve.delete(APP_NAME)  # its replicas end their requests first
        if address is None:  # the local cluster goes, and Serve's actors with it
            import ray

            ray.shutdown()


def start_application(app, name: str = APP_NAME, route_prefix: str = "/") -> None:
    """Run `app` on Ray Serve (started) and return once its replicas answer. RayServeError, in
    one line, when a replica cannot start (its model does not load on its node, say)."""
    try:
        serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
    except RuntimeError as error:  # Ray Serve gave up after its retries
        raise RayServeError(f"the application could not start: {_cause(error, name)}") from None


def _cause(error: Exception, name: str) -> str:
    """Why the application `name` could not start, in one line: the replica's own error where
    Ray Serve kept it (a traceback, in the deployment's status), else Ray Serve's last line."""
    with contextlib.suppress(Exception):  # the status is a help, not a must
        message = serve.status().applications[name].deployments[ENGINE].message
        ours = [line for line in message.splitlines() if f"{RayServeError.__name__}: " in line]
        if ours:
            return ours[-1].split(f"{RayServeError.__name__}: ", 1)[1]
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
