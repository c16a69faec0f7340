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

This module builds and runs the application; its parts live beside it: ray_serve_calls (what
passes between them), ray_serve_routers (the two routers), ray_serve_replica (Engine),
ray_serve_gateway (Gateway, /health and /metrics over the replicas) and ray_serve_relay (a
replica's answer on its way to the client).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

try:
    from ray import serve
    from ray.serve.config import HTTPOptions, RequestRouterConfig
except ImportError as error:  # the optional extra is missing
    raise ImportError("multiseq.ray_serve needs Ray Serve: pip install 'multiseq[ray]'") from error

from multiseq import ray as multiseq_ray
from multiseq.config import RunnerConfig
from multiseq.ray_serve.calls import ENGINE, RayServeError
from multiseq.ray_serve.gateway import Gateway
from multiseq.ray_serve.replica import Engine
from multiseq.ray_serve.routers import LeastBusyRouter, PrefixAffinityRouter
from multiseq.server.app import ServerSettings
from multiseq.server.routing import ROUTINGS
from multiseq.server.serve import GRACEFUL_SHUTDOWN_SECONDS

APP_NAME = "multiseq"
GATEWAY = "Gateway"
# What an Engine replica takes at once beyond its queue (the server's own limits answer first).
ENGINE_EXTRA_ONGOING = 64
# The gateway only relays (each engine's queue bounds the work): Ray Serve's default of 5 at once
# would queue streams in front of it.
GATEWAY_MAX_ONGOING = 100_000
# How often Ray Serve checks a replica: a dead one is found, and replaced, this soon.
HEALTH_CHECK_PERIOD_S = 2.0


class _GatewayDeployment:
    def __init__(self, engine, max_body_bytes: int, num_replicas: int) -> None:
        self.gateway = Gateway(engine, max_body_bytes, num_replicas)

    def __serve_build_asgi_app__(self) -> Gateway:
        return self.gateway


def build_app(config: RunnerConfig | list[RunnerConfig], settings: ServerSettings, replicas: int,
              routing: str = "prefix", gpus: float = 0, max_imbalance: int | None = None, share_prefixes: bool = True):
    """The Ray Serve application: `replicas` Engine replicas (each a server with `config` and
    `settings`, asking Ray for config.threads CPUs and `gpus` GPUs; with a config for each of
    several models, every model on each replica, their threads summed) behind the Gateway. Run it
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
    configs = config if isinstance(config, list) else [config]
    router = (RequestRouterConfig(request_router_class=PrefixAffinityRouter, request_router_kwargs={
        "max_imbalance": configs[0].parallel if max_imbalance is None else max_imbalance})
        if routing == "prefix" else RequestRouterConfig(request_router_class=LeastBusyRouter))
    engine = serve.deployment(
        Engine, name=ENGINE, num_replicas=replicas,
        ray_actor_options={"num_cpus": threads_of(configs), "num_gpus": gpus},
        max_ongoing_requests=settings.max_queue + sum(each.parallel for each in configs) + ENGINE_EXTRA_ONGOING,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_SECONDS, max_constructor_retry_count=1,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        request_router_config=router)
    gateway = serve.deployment(serve.ingress()(_GatewayDeployment), name=GATEWAY, num_replicas=1,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=GATEWAY_MAX_ONGOING)
    engines = engine.bind(configs, settings, share_prefixes and routing == "prefix")
    return gateway.bind(engines, max(settings.max_body_bytes, settings.max_upload_bytes), replicas)


def threads_of(configs: list[RunnerConfig]) -> int:
    """The CPUs a replica asks for: the threads of every model it serves (they step at once)."""
    return sum(each.threads for each in configs)


def run(config: RunnerConfig | list[RunnerConfig], settings: ServerSettings, replicas: int, address: str | None,
        host: str, port: int,
        routing: str = "prefix", gpus: float = 0, on_ready: Callable[[str], None] | None = None,
        share_prefixes: bool = True) -> None:
    """`multiseq serve --ray`: join the cluster at `address` (None: start a local one), run the
    application with Ray Serve's proxy on host:port, and keep it until SIGINT or SIGTERM; then
    delete it (and stop the local cluster). RayError or RayServeError: one line for the user."""
    multiseq_ray.connect(address)
    multiseq_ray.check_cpus(replicas, threads_of(config if isinstance(config, list) else [config]), gpus,
                            option="--replicas")
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
