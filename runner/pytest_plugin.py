"""A pytest plugin for testing your own prompts against a small real GGUF model.

Installed with multiseq (the `pytest11` entry point), it adds two session-scoped fixtures
and two options:

    def test_capital(multiseq_runner):
        [result] = multiseq_runner.run_batch([Request(prompt="The capital of France is",
                                                      sampling=SamplingParams(max_tokens=8, temperature=0))])
        assert "Paris" in result.text

- `multiseq_model`: the model loaded once per session (a registry model is fetched into the
  user's cache folder on first use).
- `multiseq_runner`: a started Runner on it, shared by the session's tests.
- `--multiseq-model NAME_OR_PATH` (default: the registry's default model) and
  `--multiseq-parallel N` (default: RunnerConfig's).

Loading the plugin is cheap: llama.cpp and the model are only loaded when a test asks for a
fixture, so sessions that do not use them pay nothing.
"""

from __future__ import annotations

import pytest

from .models.registry import DEFAULT_MODEL
from .config import RunnerConfig, default_of


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("multiseq", "multiseq: tests against a real GGUF model")
    group.addoption("--multiseq-model", default=DEFAULT_MODEL,
                    help=f"registry name or .gguf path for the multiseq fixtures (default: {DEFAULT_MODEL})")
    group.addoption("--multiseq-parallel", type=int, default=default_of(RunnerConfig, "parallel"),
                    help="slots of the multiseq_runner fixture (default: %(default)s)")


@pytest.fixture(scope="session")
def multiseq_model(pytestconfig: pytest.Config):
    """The --multiseq-model, loaded once for the whole session."""
    from .loading import open_model

    model = open_model(pytestconfig.getoption("--multiseq-model"))
    yield model
    model.close()


@pytest.fixture(scope="session")
def multiseq_runner(pytestconfig: pytest.Config, multiseq_model):
    """A started Runner on multiseq_model with --multiseq-parallel slots, shared by the session."""
    from .loop.runner import Runner

    config = RunnerConfig(model=multiseq_model.path, parallel=pytestconfig.getoption("--multiseq-parallel"))
    runner = Runner.on_model(multiseq_model, config)
    runner.start()
    yield runner
    runner.close()
