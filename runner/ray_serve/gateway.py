"""The gateway of multiseq.ray_serve: the ASGI app behind Ray Serve's proxy, which hands each
request to an Engine replica through the deployment handle (its router picks which), and
answers /health, /metrics and the page's /status and /status/events for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ray.exceptions import RayError
from starlette.responses import JSONResponse, Response, StreamingResponse

from multiseq.ray_serve.calls import HttpCall
from multiseq.ray_serve.relay import Answer, Collector, Relay, error_response
from multiseq.ray_serve.routers import router_of
from multiseq.ray_serve.status import merge_status
from multiseq.server.routing import response_key, routing_key

logger = logging.getLogger("multiseq.server")

# A call refused by a dead replica before it started is sent to another this many times.
MAX_SEND_ATTEMPTS = 3
# How long /health and /metrics wait for a replica, and for the first replica to be known.
FAN_OUT_TIMEOUT_S = 3.0
# How often an open page's state is gathered from the replicas behind the gateway.
STATUS_EVENTS_INTERVAL_S = 1.0


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
        elif scope["method"] == "GET" and scope["path"] in ("/status", "/status/events"):
            state, response = await self._status(scope)
            if response is None:
                response = JSONResponse(state) if scope["path"] == "/status" else StreamingResponse(
                    self._status_events(scope, state), media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"})
        else:
            await self._forward(scope, receive, send)
            return
        await response(scope, receive, send)

    # --- one request, one replica ---

    async def _forward(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        body = await _read_body(receive, self._max_body_bytes)
        if body is None:
            await error_response(scope["path"], 413, f"The request body is larger than this server's limit of "
                                                      f"{self._max_body_bytes} bytes.", "request_too_large")(
                scope, receive, send)
            return
        call = HttpCall(scope["method"], scope["path"], scope.get("query_string", b""),
                        tuple((bytes(name), bytes(value)) for name, value in scope.get("headers", [])), body,
                        routing_key(scope["method"], scope["path"], body), client=_client_of(scope))
        relay = Relay(send, scope["path"], on_response_id=self._note_home)
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

    def _note_home(self, response_id: str, replica: str) -> None:
        """A stored response's replica: requests naming it go there (noted before its id goes out)."""
        router = router_of(self._engine)
        if router is not None:
            router.note(response_key(response_id), replica)

    # --- all replicas ---

    async def _replica_names(self) -> list[str]:
        """The replicas the router knows (asking one replica first when it knows none yet: a
        handle's router starts with its first call)."""
        router = router_of(self._engine)
        if router is None or not router.replica_names():
            with contextlib.suppress(asyncio.TimeoutError, RayError):
                await asyncio.wait_for(self._ask(None, "/health", ()), FAN_OUT_TIMEOUT_S)
            router = router_of(self._engine)
        return router.replica_names() if router is not None else []

    async def _ask(self, replica: str | None, path: str, headers: tuple) -> Answer | None:
        """GET `path` of one replica (None: any), whole; None when it did not answer."""
        call = HttpCall("GET", path, b"", headers, b"", replica=replica)
        relay = Collector()
        try:
            async for batch in self._engine.options(stream=True).handle_http.remote(call):
                relay.take(batch)
        except RayError:
            return None
        return relay.answer()

    async def _ask_all(self, path: str, scope: dict[str, Any]) -> dict[str, Answer | None]:
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


    async def _status(self, scope: dict[str, Any]) -> tuple[dict[str, Any] | None, Response | None]:
        """The page's state over every replica; or, when a replica refused the call (no key, a
        wrong key), its own answer."""
        answers = await self._ask_all("/status", scope)
        refused = next((answer for answer in answers.values() if answer is not None and answer.status != 200), None)
        if refused is not None:
            return None, Response(refused.body, status_code=refused.status, headers=refused.headers)
        return merge_status({name: None if answer is None else json.loads(answer.body)
                             for name, answer in answers.items()}), None

    async def _status_events(self, scope: dict[str, Any], state: dict[str, Any]):
        """An open page's state, gathered again every STATUS_EVENTS_INTERVAL_S."""
        while state is not None:
            yield f"data: {json.dumps(state, separators=(',', ':'))}\n\n"
            await asyncio.sleep(STATUS_EVENTS_INTERVAL_S)
            state, _ = await self._status(scope)


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
