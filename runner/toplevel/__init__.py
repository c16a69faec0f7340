"""multiseq: run many prompts at once over one llama.cpp context (continuous batching).

    from multiseq import Runner, RunnerConfig, Request, SamplingParams

    with Runner(RunnerConfig(model="smollm2-135m", parallel=8)) as runner:
        for result in runner.run_batch([Request(prompt="The sea is"), Request(prompt="The sky is")]):
            print(result.id, result.text)

This file installs as the top of the `multiseq` package (pyproject.toml maps it there); the
library is multiseq.runner, the command line multiseq.cli, the model registry multiseq.models.
It lives in runner/ rather than at the repository's root so that the repository itself is not a
Python package (test runners would import it under its folder's name).
"""

import importlib


def __getattr__(name: str):
    """The public API (multiseq.runner's __all__, the one list of its names), imported on first
    use: `import multiseq` alone is instant, so the command line can take charge of Ctrl-C
    before numpy and the engine load."""
    runner = importlib.import_module("multiseq.runner")
    if name == "__all__":
        return runner.__all__
    if name in runner.__all__:
        return getattr(runner, name)
    raise AttributeError(f"module 'multiseq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(importlib.import_module("multiseq.runner").__all__))
