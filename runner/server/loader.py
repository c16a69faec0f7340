"""Models loaded when a request names them, within a limit of loaded models, and unloaded once
idle for their keep-alive: Ollama's way and llama-server's router's, in one process.

A load runs on a daemon thread of its own (llama.cpp reads the file; the event loop and every
other model's steps go on, and a server stopped meanwhile does not wait for it: the runner is
closed when the load ends); the requests for a model being loaded await that one load. Before a load,
when --models-max are loaded, the least recently used idle model is unloaded to make room; when
none is idle, the load waits for one, up to a bound, then answers 503. A model idle for its
keep-alive (the server's default, or the last request's `keep_alive`; 0: at once) is unloaded by
a sweep on the event loop; its next request loads it again. While every loaded model is idle,
the sweep prepares the models not loaded (what their load would do holding the GIL). The
default model (the first) is never unloaded: the Batch API, /metrics and the dashboard are its.
A model that fails to load fails its requests with a 503 naming it, and the others go on.

With a memory budget (--models-memory, multiseq.server.budget), each model's share is computed
before its first load, and a load first unloads least recently used idle models until the
process stays within the budget; a model that can never fit fails its requests saying so.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ..loop.runner import Runner
from .budget import MemoryBudget, size_text
from .errors import OVERLOADED, ApiError
from .limits import RETRY_AFTER_SECONDS
from .models import ServedModel, ServedModels

logger = logging.getLogger("multiseq.server")

SWEEP_INTERVAL_SECONDS = 0.25
ROOM_POLL_SECONDS = 0.05


class ModelLoader:
    """Loads and unloads the served models that have a config (`open_runner` opens one, on the
    loading thread); `attach` serves a loaded runner (the server's), `on_unloaded` sees one go."""

    def __init__(self, models: ServedModels, open_runner: Callable[[Any], Runner],
                 attach: Callable[[Runner, str], None], max_loaded: int = 0, room_timeout_s: float = 60.0,
                 on_unloaded: Callable[[Runner], None] | None = None, keep_alive_s: float = math.inf,
                 prepare: Callable[[Any], None] | None = None, memory: MemoryBudget | None = None,
                 is_prepared: Callable[[Any], bool] = lambda config: True) -> None:
        self.models = models
        self.open_runner = open_runner
        self.attach = attach
        self.max_loaded = max_loaded  # 0: no limit
        self.room_timeout_s = room_timeout_s
        self.on_unloaded = on_unloaded
        self.keep_alive_s = keep_alive_s  # a model's until a request says otherwise
        self.is_closed = False  # the server stopped: a load that ends now closes its runner
        self.prepare = prepare  # builds, from a config, what its load would build holding the GIL
        self.prepared: set[str] = set()  # the models whose preparation ran
        # Whether a loaded model's load built what `prepare` builds (it does not while others stream).
        self.is_prepared = is_prepared
        self.memory = memory  # None: loads are bounded by their count alone

    async def ensure_loaded(self, model: ServedModel) -> None:
        """Return once `model` is loaded (or could not be: its failure says why); a load under
        way is awaited, not started again. ApiError 503 when no room could be made in time."""
        if model.runner is not None or model.failure is not None or model.config is None:
            return
        if model.loading is None:
            model.loading = asyncio.ensure_future(self._load(model))
        await asyncio.shield(model.loading)  # a request that goes away leaves the load to the others

    async def _load(self, model: ServedModel) -> None:
        try:
            if not await self._measured(model):
                return
            await self._make_room(model)
            started = time.monotonic()
            try:
                runner = await self._opened(model.config)
            except Exception as error:  # noqa: BLE001 - said to its requests, logged in one line
                logger.error("the model %s could not load: %s", model.name, error)
                model.failure = f"the model could not load: {error}"
                return
            model.idle_since, model.keep_alive_s = None, self.keep_alive_s
            if self.memory is not None:
                self.memory.kept.add(model.name)
            self.attach(runner, model.name)
            logger.info("loaded %s in %.1f s", model.name, time.monotonic() - started)
        finally:
            model.loading = None

    async def _measured(self, model: ServedModel) -> bool:
        """With a memory budget, the model's share known and its config sized within the
        budget; False, its failure said, when it cannot be known or is over the budget alone."""
        if self.memory is None:
            return True
        try:
            memory = await self.memory.measured(model.name, model.config)
        except Exception as error:  # noqa: BLE001 - said to its requests, as a failed load is
            logger.error("the model %s could not load: %s", model.name, error)
            model.failure = f"the model could not load: {error}"
            return False
        model.config = memory.config
        why = self.memory.too_large_alone(model.name)
        if why is not None:
            model.told_failure, model.failure = why, f"the model could not load: {why}"
            logger.error("the model %s could not load: %s", model.name, why)
            return False
        return True

    async def _make_room(self, model: ServedModel) -> None:
        """Unload least recently used idle models until one more fits under max_loaded and the
        memory budget; wait for one to become idle when none is, up to room_timeout_s. A 503
        at once where unloading every other model could not make room in the budget."""
        deadline = time.monotonic() + self.room_timeout_s
        while not self.has_room_for(model):
            if self.memory is not None and not self.memory.fits(model.name, self._staying()):
                raise self._no_room(model, f"it does not fit in --models-memory {size_text(self.memory.limit_bytes)} "
                                           f"beside the models that stay loaded", "models_memory")
            idle = [other for other in self.models if other is not model and other.is_idle and self.can_unload(other)]
            if idle:
                await self.unload(min(idle, key=lambda other: other.picked_at))
                continue
            if time.monotonic() > deadline:
                limit = f"{self.max_loaded} models are loaded (--models-max)" if self._too_many(model) else \
                    f"the loaded models take what --models-memory {size_text(self.memory.limit_bytes)} holds"
                raise self._no_room(model, f"{limit} and every one is busy", "models_busy")
            await asyncio.sleep(ROOM_POLL_SECONDS)

    @staticmethod
    def _no_room(model: ServedModel, why: str, code: str) -> ApiError:
        return ApiError(503, f"The model {model.name!r} cannot be loaded now: {why}. Retry later.", OVERLOADED,
                        code=code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    def has_room_for(self, model: ServedModel) -> bool:
        """Whether `model` may load now without unloading another (its share measured)."""
        return not self._too_many(model) and \
            (self.memory is None or self.memory.fits(model.name, [other.name for other in self._holding(model)]))

    async def load_if_room(self, model: ServedModel) -> bool:
        """Load `model` where it fits beside those loaded, unloading none (a server's start);
        False when it is left for its first request."""
        if await self._measured(model) and self.has_room_for(model):
            await self.ensure_loaded(model)
            return True
        return False

    def _staying(self) -> list[str]:
        """The loaded models no unload can take away (the default)."""
        return [other.name for other in self.models if other.runner is not None and not self.can_unload(other)]

    def _too_many(self, model: ServedModel) -> bool:
        return bool(self.max_loaded) and len(self._holding(model)) >= self.max_loaded

    def _holding(self, model: ServedModel) -> list[ServedModel]:
        """Models loaded, or being loaded (but `model`): what the limits count."""
        return [other for other in self.models
                if other.runner is not None or (other.loading is not None and other is not model)]

    async def _opened(self, config: Any) -> Runner:
        """open_runner(config) on a daemon thread; a runner that comes after the server stopped
        (or its loop ended) is closed there."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def settle(runner: Runner | None, error: BaseException | None) -> None:
            if future.cancelled() or self.is_closed:
                if runner is not None:
                    runner.close()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(runner)

        def load() -> None:
            try:
                runner, error = self.open_runner(config), None
            except Exception as failure:  # noqa: BLE001 - handed to the loop, raised there
                runner, error = None, failure
            try:
                loop.call_soon_threadsafe(settle, runner, error)
            except RuntimeError:  # the loop has ended: no one will serve it
                if runner is not None:
                    runner.close()

        threading.Thread(target=load, name="multiseq-load", daemon=True).start()
        return await future

    def can_unload(self, model: ServedModel) -> bool:
        return model.runner is not None and model.config is not None and model is not self.models.default

    async def unload(self, model: ServedModel) -> bool:
        """Unload a loaded model now (what runs on it is cancelled); False when it was not
        loaded, or is the default (which stays)."""
        if not self.can_unload(model):
            return False
        runner, model.runner = model.runner, None
        model.idle_since, model.keep_alive_s = None, math.inf
        await asyncio.to_thread(runner.close)  # what ran on it ends cancelled, its results delivered
        if self.on_unloaded is not None:
            self.on_unloaded(runner)
        logger.info("unloaded %s", model.name)
        return True

    async def sweep(self) -> None:
        """Unload, every SWEEP_INTERVAL_SECONDS, each model idle for its keep-alive (runs until cancelled)."""
        while True:
            now = time.monotonic()
            for model in self.models:
                if not model.is_idle:
                    model.idle_since = None
                elif model.idle_since is None:
                    model.idle_since = now
                if model.idle_since is not None and now - model.idle_since >= model.keep_alive_s and \
                        self.can_unload(model):
                    await self.unload(model)
            await self._prepare_one_while_idle()
            await asyncio.sleep(SWEEP_INTERVAL_SECONDS)

    async def _prepare_one_while_idle(self) -> None:
        """While every loaded model is idle, prepare one model (its constraints' tokenizer: 780
        ms with the GIL held on a 262k vocabulary, which would otherwise stall every stream of
        the other models): one not loaded, before its load; or one loaded while others streamed,
        whose load left it (a built one is found in the process's cache at once)."""
        if self.prepare is None or not all(model.is_idle for model in self.models if model.runner is not None):
            return
        waiting = [model for model in self.models if model.config is not None and model.loading is None and
                   model.failure is None and model.name not in self.prepared and
                   (model.runner is None or not self.is_prepared(model.config))]
        if not waiting:
            return
        model = waiting[0]
        if self.memory is not None and model.runner is None:  # what it keeps must fit beside the loaded models
            loaded = [other.name for other in self.models if other.runner is not None]
            if not await self._measured(model) or not self.memory.fits(model.name, loaded, kept_only=True):
                return
        self.prepared.add(model.name)
        try:
            await asyncio.to_thread(self.prepare, model.config)
        except Exception as error:  # noqa: BLE001 - its load will meet it again, and say so
            logger.warning("could not prepare %s before its load: %s", model.name, error)
        if self.memory is not None:
            self.memory.kept.add(model.name)
