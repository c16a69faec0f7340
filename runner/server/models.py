"""The models one server serves, by name: each has a runner of its own (None while it loads),
and every API's `model` field picks one (none: the first, the server's default).

A name is the one the model is served as (`--alias`, else its registry name or file name);
Ollama's clients add a tag, so `NAME:latest` is NAME too. An unknown name is a 404 naming the
served ones, in each API's own shape (its route converts the ApiError).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..loop.runner import Runner
from .errors import INVALID_REQUEST, OVERLOADED, ApiError
from .limits import RETRY_AFTER_SECONDS

OLLAMA_TAG = ":latest"
# A model a request picked this recently is not idle: the request may still be on its way to
# the runner's queue (rendering, tokenizing).
PICKED_GRACE_SECONDS = 2.0


@dataclass
class ServedModel:
    name: str
    runner: Runner | None = None  # None: not loaded (loading, unloaded, or it could not load)
    failure: str | None = None  # why it could not load
    told_failure: str | None = None  # why, where its clients may be told (no path, no internals)
    config: Any = None  # what a loader opens it from (None: it is attached, never loaded here)
    loading: asyncio.Future | None = None  # a load under way, which requests for it await
    picked_at: float = 0.0  # when a request last picked it (monotonic)
    keep_alive_s: float = math.inf  # idle this long, it is unloaded (the last request's keep_alive)
    idle_since: float | None = None  # when it was first seen idle since its last use
    aliases: tuple[str, ...] = ()  # more names requests may give it (a models file's `alias`)
    adapters: tuple[str, ...] = ()  # its LoRA adapters served as models of their own (--lora-modules)

    @property
    def status(self) -> str:
        """loaded, loading, unloaded or failed (llama-server's router says these)."""
        if self.failure is not None or (self.runner is not None and self.runner.failure is not None):
            return "failed"
        if self.runner is not None:
            return "loaded"
        return "unloaded" if self.config is not None and self.loading is None else "loading"

    @property
    def is_idle(self) -> bool:
        """Loaded, and nothing of it waiting or running (nor picked a moment ago, on its way in)."""
        runner = self.runner
        return runner is not None and runner.num_waiting == 0 and runner.latest_snapshot.num_running == 0 and \
            time.monotonic() - self.picked_at > PICKED_GRACE_SECONDS


class ServedModels:
    """The served models in the order they were named; the first is the default."""

    def __init__(self, names: Sequence[str], aliases: Mapping[str, str] | None = None,
                 adapters: Mapping[str, str] | None = None) -> None:
        aliases, adapters = dict(aliases or {}), dict(adapters or {})
        if not names or len(set(names)) != len(names) or len({*aliases, *adapters, *names}) != \
                len(aliases) + len(adapters) + len(names) or not {*aliases.values(), *adapters.values()} <= set(names):
            raise ValueError(f"a server serves one model or more, each under its own names: got {list(names)}, "
                             f"aliases {aliases}, adapters {adapters}")
        self._models = {name: ServedModel(name) for name in names}
        self._aliases = {alias: self._models[name] for alias, name in aliases.items()}
        for alias, model in self._aliases.items():
            model.aliases += (alias,)
        # A LoRA adapter served as a model (--lora-modules): its requests run on its base's runner.
        self._adapters = {name: self._models[base] for name, base in adapters.items()}
        for name, model in self._adapters.items():
            model.adapters += (name,)
        self.default = self._models[names[0]]

    def adapter_of(self, name: object) -> str | None:
        """The adapter a request's model name stands for (None: a model's own name or alias)."""
        if not isinstance(name, str):
            return None
        return next((each for each in (name, name.removesuffix(OLLAMA_TAG)) if each in self._adapters), None)

    def add(self, name: str, config: Any) -> ServedModel:
        """A model served from now on (a pulled one), loaded at its first request."""
        if self.named(name) is not None:
            raise ValueError(f"a model is already served as {name!r}")
        self._models[name] = ServedModel(name, config=config)
        return self._models[name]

    def remove(self, name: str) -> None:
        """A model added (a pulled one) no longer served."""
        if self._models.get(name) is self.default:
            raise ValueError("the first model is always served")
        self._models.pop(name, None)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(list(self._models.values()))  # a pull may add one while a sweep goes over them

    def named(self, name: str) -> ServedModel | None:
        for each in (name, name.removesuffix(OLLAMA_TAG)):
            found = self._models.get(each) or self._aliases.get(each) or self._adapters.get(each)
            if found is not None:
                return found
        return None

    def pick(self, name: object) -> ServedModel:
        """The model a request names (None: the default); a 404 naming the served ones when
        there is no such model."""
        if name is None:
            return self.default
        model = self.named(name) if isinstance(name, str) else None
        if model is None:
            served = ", ".join(json.dumps(each) for model in self for each in (model.name, *model.adapters))
            raise ApiError(404, f"The model {json.dumps(name)} does not exist: this server serves {served}.",
                           INVALID_REQUEST, "model", "model_not_found")
        return model


def ready(model: ServedModel) -> Runner:
    """The model's runner, or a 503 saying why there is none to serve it now."""
    model.picked_at = time.monotonic()
    if model.failure is not None:
        why = f": {model.told_failure}" if model.told_failure else ""
        raise ApiError(503, f"The model {json.dumps(model.name)} could not be loaded{why}.", OVERLOADED,
                       code="model_failed")
    if model.runner is None:
        raise ApiError(503, f"The model {json.dumps(model.name)} is loading; try again shortly.", OVERLOADED,
                       code="model_loading", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if model.runner.failure is not None:
        raise ApiError(503, "The engine stopped after a failure; the server is shutting down.", OVERLOADED,
                       code="engine_failed")
    return model.runner
