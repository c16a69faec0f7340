"""multiseq: run many prompts at once over one llama.cpp context (continuous batching).

    from multiseq import Runner, RunnerConfig, Request, SamplingParams

    with Runner(RunnerConfig(model="smollm2-135m", parallel=8)) as runner:
        for result in runner.run_batch([Request(prompt="The sea is"), Request(prompt="The sky is")]):
            print(result.id, result.text)

The package is runner/ in the repository; a module's import name is its path there:
multiseq.loop.engine is runner/loop/engine.py, multiseq.server the HTTP app (runner/server/),
multiseq.cli the command line (cli/), multiseq.models the model registry (models/).

Its folders are its layers, bottom up: llama (the llama.cpp backend: the only module that
imports llama_cpp, and `batch`, what a step hands any backend), kv (the KV pool's cells, the
prefixes slots hold, the host-RAM tier), sampling (rows to tokens, under a constraint, with log
probabilities), tools (the models' tool-call and reasoning formats), loop (the step loop and its
scheduling: sequences, the scheduler, the thread-free engine and its threaded runner); above
them formats (request bodies, prompt files, result records), then server, ray, ray_serve and
cli. config, request and errors are the plain types every layer shares.
"""

import importlib

# Each public name and the module that defines it. They are imported on first use: `import
# multiseq` alone is instant, so the command line can take charge of Ctrl-C before numpy and
# the engine load.
_PUBLIC = {
    "BackendError": "errors", "CANCELLED_BEFORE_START": "loop.sequence", "Engine": "loop.engine",
    "FinishReason": "request", "MEDIA_MARKER": "llama.media", "OverflowPolicy": "config", "Priority": "request", "Request": "request",
    "RequestHandle": "loop.delivery", "Result": "request", "RunStats": "loop.stats", "Runner": "loop.runner",
    "RunnerConfig": "config", "RunnerSnapshot": "loop.stats", "SamplingParams": "config",
    "StepOutput": "loop.step_output", "TextPiece": "loop.step_output", "Timings": "request",
    "TokenLogprob": "sampling.logprobs", "Tool": "tools", "ToolCall": "tools", "ToolChoice": "tools",
    "TopLogprob": "sampling.logprobs",
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
