"""multiseq's library: continuous batching of many prompts over one llama.cpp context.

The public API is re-exported by the top-level package:

    from multiseq import Runner, RunnerConfig, Request, SamplingParams

    with Runner(RunnerConfig(model="smollm2-135m", parallel=8)) as runner:
        results = runner.run_batch([Request(prompt="Hello"), Request(prompt="Bonjour")])

Modules: config (RunnerConfig, SamplingParams), request (Request, Result), sequence (one
request's state), scheduler (queue, slots, plan), batch (what a step hands the backend),
hostcache (slot states saved in RAM), engine (the thread-free step loop), runner (the threaded front end), backend (the only
llama.cpp importer), sampling, topk (exact top-k of logits rows), constrained (sampling under
a constraint), grammar (constraints as llguidance matchers), logprobs, detok, stats,
pytest_plugin. Prompt files and result records are the sibling package formats
(multiseq.formats).
"""

from .config import OverflowPolicy, RunnerConfig, SamplingParams
from .engine import Engine, StepOutput, TextPiece
from .errors import BackendError
from .logprobs import TokenLogprob, TopLogprob
from .request import FinishReason, Priority, Request, Result, Timings
from .runner import RequestHandle, Runner
from .sequence import CANCELLED_BEFORE_START
from .stats import RunnerSnapshot, RunStats
from .tools import Tool, ToolCall, ToolChoice

__all__ = [
    "BackendError", "CANCELLED_BEFORE_START", "Engine", "FinishReason", "OverflowPolicy", "Priority", "Request",
    "RequestHandle", "Result", "RunStats", "Runner", "RunnerConfig", "RunnerSnapshot", "SamplingParams",
    "StepOutput", "TextPiece", "Timings", "TokenLogprob", "Tool", "ToolCall", "ToolChoice", "TopLogprob",
]
