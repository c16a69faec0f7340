"""multiseq's library: continuous batching of many prompts over one llama.cpp context.

    from runner import Runner, RunnerConfig, Request, SamplingParams

    with Runner(RunnerConfig(model="smollm2-135m", parallel=8)) as runner:
        results = runner.run_batch([Request(prompt="Hello"), Request(prompt="Bonjour")])
"""

from runner.config import OverflowPolicy, RunnerConfig, SamplingParams
from runner.engine import CANCELLED_BEFORE_START, RequestHandle, Runner
from runner.errors import BackendError
from runner.sequence import FinishReason, Request, Result, Timings
from runner.stats import RunStats

__all__ = [
    "BackendError", "CANCELLED_BEFORE_START", "FinishReason", "OverflowPolicy", "Request", "RequestHandle",
    "Result", "RunStats", "Runner", "RunnerConfig", "SamplingParams", "Timings",
]
