"""multiseq: run many prompts at once over one llama.cpp context (continuous batching).

    from multiseq import Runner, RunnerConfig, Request, SamplingParams

    with Runner(RunnerConfig(model="smollm2-135m", parallel=8)) as runner:
        for result in runner.run_batch([Request(prompt="The sea is"), Request(prompt="The sky is")]):
            print(result.id, result.text)

The package is runner/ in the repository; a module's import name is its path there:
multiseq.engine is runner/engine.py, multiseq.server the HTTP app (runner/server/), multiseq.cli
the command line (cli/), multiseq.models the model registry (models/).

The engine, bottom up: backend (the only llama.cpp importer), batch (what a step hands the
backend), sampling, topk, constrained and grammar (sampling under a constraint), schema,
logprobs, detok, tools (tool calling), sequence (one request's state), scheduler (queue, slots,
plan), prefix, hostcache (slot states saved in RAM), engine (the thread-free step loop), runner
(its threaded front end), stats. Above it: formats (request bodies, prompt files, result
records), server, ray, cli.
"""

import importlib

# Each public name and the module that defines it. They are imported on first use: `import
# multiseq` alone is instant, so the command line can take charge of Ctrl-C before numpy and
# the engine load.
_PUBLIC = {
    "BackendError": "errors", "CANCELLED_BEFORE_START": "sequence", "Engine": "engine", "FinishReason": "request",
    "OverflowPolicy": "config", "Priority": "request", "Request": "request", "RequestHandle": "runner",
    "Result": "request", "RunStats": "stats", "Runner": "runner", "RunnerConfig": "config",
    "RunnerSnapshot": "stats", "SamplingParams": "config", "StepOutput": "engine", "TextPiece": "engine",
    "Timings": "request", "TokenLogprob": "logprobs", "Tool": "tools", "ToolCall": "tools", "ToolChoice": "tools",
    "TopLogprob": "logprobs",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'multiseq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
