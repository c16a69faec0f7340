"""Serving the app with uvicorn: listening at once, the model loading behind /health's 503.

SIGINT or SIGTERM stops taking connections and cancels the running requests, whose streams end
with an error event and [DONE] rather than a cut connection; a request that comes meanwhile gets
a 503, and an idle server (or one still loading its model) exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

import uvicorn

from ..config import RunnerConfig
from ..loop.runner import Runner
from .app import ServerSettings, ServerState, create_app
from .budget import MemoryBudget, ModelMemory
from .loader import ModelLoader
from .ollama_pull import serve_pulled

logger = logging.getLogger("multiseq.server")

# Long enough for streams to send their last event once their requests are cancelled.
GRACEFUL_SHUTDOWN_SECONDS = 5
ENGINE_WATCH_INTERVAL_SECONDS = 0.25  # how often serve() looks whether the engine stopped
# How long the event loop may keep the GIL from the engine's thread once that thread wants it
# back (Python's default is 5 ms). The engine lets go of the GIL in every llama_decode and in
# numpy's sampling; when it returns, a loop busy writing streams held it up to 5 ms more, each
# step: on a fast model that is most of a step (bench/hostpath.py --server: 64 streams served
# at 0.72x the engine's tokens/s with 5 ms, 0.78-0.84x with 1 ms, both with --stream-interval 0.04).
SERVING_SWITCH_INTERVAL_SECONDS = 0.001


class Server(uvicorn.Server):
    """uvicorn's server, which also tells the app to wind down when a signal asks it to stop,
    and says when it listens (and on which port: port 0 picks a free one)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.listening = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweep: asyncio.Future | None = None

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        self.state.metrics.loop_lag.start()
        self.state.monitor.start()  # the page's plots cover the minutes before it is opened
        if self.state.loader is not None:  # idle models unloaded after their keep-alive
            self._sweep = asyncio.ensure_future(self.state.loader.sweep())
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    async def shutdown(self, sockets=None) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        await super().shutdown(sockets)
        self.state.metrics.loop_lag.stop()
        self.state.monitor.stop()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the server (uvicorn's own raises the signal again once it
        stopped, which would end the process before the runner is closed)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:  # the signal handler interrupts the loop's own thread: hand it over
            self._loop.call_soon_threadsafe(self.state.begin_shutdown)

    def stop(self) -> None:
        """Stop from another thread (what a signal does)."""
        self.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.state.begin_shutdown)


def prepare_constraints(runner: Runner) -> None:
    """Build llguidance's tokenizer over the model's vocabulary while the model loads (unless
    built before: it is kept for the process, across unloads), not at the first request with
    tools or a schema: the build holds the GIL (115 ms of its 326 on SmolLM2's 49k tokens, 780
    ms in one piece on Gemma 3's 262k), which would stall every stream. Not for a model that
    does not generate (an encoder, a reranker); and a vocabulary llguidance cannot read fails
    only the constrained requests (each says why), never the server."""
    backend = runner.backend
    if backend.ranks or backend.embeds_whole:
        return
    try:
        backend.grammar_tokenizer()
    except ValueError as error:
        logger.warning("constrained output (schemas, grammars, forced tool calls) is not available with this "
                       "model's vocabulary: %s", error)


def prepare_constraints_of(config: RunnerConfig) -> None:
    """multiseq.loading's, imported at the first call (it loads llama.cpp)."""
    from ..loading import prepare_constraints_of as prepare

    prepare(config)


def constraints_prepared_of(config: RunnerConfig) -> bool:
    """multiseq.loading's, imported at the first call (it loads llama.cpp)."""
    from ..loading import constraints_prepared_of as prepared

    return prepared(config)


def memory_of(config: RunnerConfig, room_bytes: int) -> ModelMemory:
    """multiseq.loading's, imported at the first call (it loads llama.cpp)."""
    from ..loading import memory_of as measure

    return ModelMemory(*measure(config, room_bytes))


def freeze_loaded_objects() -> None:
    """Leave what loading made (the model's vocabulary and caches, templates, modules) out of
    the garbage collector's full passes from now on. Such a pass walks every tracked object and
    holds the GIL meanwhile: with the model's objects in it, one took 73 ms on the event loop
    during the agents-tools load benchmark, a pause in every stream."""
    gc.collect()
    gc.freeze()


def hand_back_the_gil_sooner() -> None:
    """A serving process's GIL switch interval (SERVING_SWITCH_INTERVAL_SECONDS)."""
    sys.setswitchinterval(SERVING_SWITCH_INTERVAL_SECONDS)


def prepare_to_serve(runner: Runner, constraints: bool = True) -> None:
    """What a process does with its loaded runner before it serves (serve, and each Ray Serve
    replica): nothing it would otherwise do at a first request, or in a long pause, then. Without
    `constraints` (other models stream: building them holds the GIL), they are left for an idle
    moment (ModelLoader's sweep) or the first constrained request."""
    if constraints:
        prepare_constraints(runner)
    freeze_loaded_objects()
    hand_back_the_gil_sooner()


def open_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), IPv4 or IPv6 as the host says.

    Its connections send without Nagle's delay. asyncio turns it off only for sockets whose
    protocol is IPPROTO_TCP, and socket.create_server makes them with protocol 0: on a kept-alive
    connection a response's body (or a stream's next event) then waited for the client's delayed
    ACK of the headers, 40 ms a request. Linux gives accepted sockets the listener's TCP_NODELAY."""
    family, _, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
    listener = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError:
        listener.close()
        raise
    return listener


def make_server(app, host: str, port: int, access_log: bool = True) -> Server:
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log, log_config=None,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS, lifespan="off")
    return Server(config, app.state.server)


async def _stop_when_the_engine_fails(server: Server, state, failure: list[str]) -> None:
    """An engine that stopped fails every request: the server stops too (its streams get their
    error first), and serve() says why (in `failure`), so that a supervisor starts a new one."""
    while not server.should_exit:
        for model in state.models:
            runner = model.runner
            if runner is not None and runner.failure is not None:
                failure.append(f"{runner.failure_message}; the server stopped so that it can be started again")
                server.stop()
                return
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_SECONDS)


async def _load_at_start(server: Server, on_ready: Callable[[Runner], None] | None, failure: list[str],
                         pulled: set[str] = frozenset()) -> None:
    """Load the models the server starts with (the first --models-max, every one without a
    limit, but those a models file defers, and those over the memory budget beside the ones
    before them) one after the other, each served as soon as it has loaded; one that cannot load
    is marked so (its requests get a 503), and when none could, the server stops saying why. The
    others load at their first request."""
    state = server.state
    deferred = (set(state.settings.deferred_models) | pulled) - {state.models.default.name}
    first = [model for model in state.models if model.name not in deferred][:state.loader.max_loaded or None]
    for model in first:
        await state.loader.load_if_room(model)
        if server.should_exit:
            return
        if on_ready is not None and model.runner is not None and model is state.models.default:
            on_ready(model.runner)
    if all(model.runner is None for model in first):
        failure.append(next((model.failure for model in first if model.failure), "no model could load"))
        server.should_exit = True


def _prepared(open_runner: Callable[[RunnerConfig], Runner], others_busy: Callable[[], bool]) \
        -> Callable[[RunnerConfig], Runner]:
    """open_runner, then what the process does before serving the runner (on the loading thread;
    its constraints' tokenizer only while no other model streams)."""
    def open_prepared(config: RunnerConfig) -> Runner:
        runner = open_runner(config)
        prepare_to_serve(runner, constraints=not others_busy())
        return runner
    return open_prepared


def serve(config: RunnerConfig | list[RunnerConfig], settings: ServerSettings, host: str, port: int,
          access_log: bool = True, on_listening: Callable[[Server], None] | None = None,
          on_ready: Callable[[Runner], None] | None = None,
          open_runner: Callable[[RunnerConfig], Runner] = Runner,
          prepare_model: Callable[[RunnerConfig], None] = prepare_constraints_of,
          measure_model: Callable[[RunnerConfig, int], ModelMemory] = memory_of) -> str | None:
    """Serve until a signal stops the server. The models (a config each: settings.model_name's,
    then settings.more_models') load one after the other once the socket is open; each serves
    as soon as it has loaded, and one that cannot load answers 503 while the others go on
    (on_ready is told of the first). Returns None, or why the server stopped by itself: no model
    could load, or an engine stopped after a failure that was no one request's."""
    configs = config if isinstance(config, list) else [config]
    app = create_app(None, settings)  # StoreError: the data directory cannot be used
    try:
        listener = open_socket(host, port)  # OSError (a taken port, say) before anything else starts
    except BaseException:
        app.state.server.close()
        raise
    server = make_server(app, host, port, access_log)
    failure: list[str] = []
    state = app.state.server
    for model, model_config in zip(state.models, configs):
        model.config = model_config
    pulled = serve_pulled(state)  # the models pulled before a restart: loaded at their first request
    memory = None if settings.models_memory_bytes is None else MemoryBudget(settings.models_memory_bytes, measure_model)
    others_busy = lambda: any(model.runner is not None and not model.is_idle for model in state.models)  # noqa: E731
    state.loader = ModelLoader(state.models, _prepared(open_runner, others_busy), state.attach, settings.models_max,
                               on_unloaded=state.forget_runner, keep_alive_s=settings.model_keep_alive_s,
                               prepare=prepare_model, memory=memory, is_prepared=constraints_prepared_of)

    async def run() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=[listener]))
        await asyncio.to_thread(server.listening.wait)
        if on_listening is not None:
            on_listening(server)
        background = [asyncio.ensure_future(task) for task in (
            _load_at_start(server, on_ready, failure, set(pulled)),
            _stop_when_the_engine_fails(server, state, failure))]
        await serving
        for task in background:
            task.cancel()

    try:
        asyncio.run(run())
    finally:
        # A model still loading is not waited for: its thread is a daemon, and closes the runner
        # itself if the load ends after this (ModelLoader).
        state.loader.is_closed = True
        app.state.server.close()  # the batch worker ends before the runner it feeds
        for model in app.state.server.models:
            if model.runner is not None:
                model.runner.close()
    return failure[0] if failure else None
