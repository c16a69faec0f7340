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

from typing import TYPE_CHECKING

__all__ = [
    "BackendError", "CANCELLED_BEFORE_START", "Engine", "FinishReason", "OverflowPolicy", "Request",
    "RequestHandle", "Result", "RunStats", "Runner", "RunnerConfig", "RunnerSnapshot", "SamplingParams",
    "StepOutput", "TextPiece", "Timings", "TokenLogprob", "TopLogprob",
]

if TYPE_CHECKING:
    from multiseq.runner import (CANCELLED_BEFORE_START, BackendError, Engine, FinishReason, OverflowPolicy,
                                 Request, RequestHandle, Result, Runner, RunnerConfig, RunnerSnapshot, RunStats,
                                 SamplingParams, StepOutput, TextPiece, Timings, TokenLogprob, TopLogprob)


def __getattr__(name: str):
    """The public API, imported on first use: `import multiseq` alone is instant, so the
    command line can take charge of Ctrl-C before numpy and the engine load."""
    if name in __all__:
        from multiseq import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'multiseq' has no attribute {name!r}")
