"""The options batch-run and serve share: the model, the engine, sampling defaults.

Each group is a decorator; the command gets the options as keyword arguments and builds its
RunnerConfig and SamplingParams with runner_config() and sampling_defaults(). Defaults come
from the library's dataclasses (default_of), so the command line and the library agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .. import models
from ..runner import RunnerConfig, SamplingParams
from ..runner.config import OverflowPolicy, default_of

ENGINE_FIELDS = ("model", "parallel", "slot_ctx", "threads", "n_keep", "n_discard", "seed", "chat_template",
                 "prefix_cache", "batch_invariant", "overflow")
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "stop", "ignore_eos",
                   "strict_schema")


def _apply(decorators: list[Callable]) -> Callable:
    def decorate(function: Callable) -> Callable:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return decorate


def engine_options(slot_ctx_help: str = "Context tokens per slot (prompt + generation).") -> Callable:
    return _apply([
        click.option("-m", "--model", default=models.DEFAULT_MODEL, show_default=True,
                     help="Registry model name or path to a .gguf file."),
        click.option("-np", "--parallel", default=default_of(RunnerConfig, "parallel"), show_default=True,
                     type=click.IntRange(1, 256), help="Sequences decoded together (slots)."),
        click.option("--slot-ctx", default=None, type=click.IntRange(16), help=slot_ctx_help + " [default: "
                     f"{default_of(RunnerConfig, 'slot_ctx')}]"),
        click.option("-t", "--threads", default=default_of(RunnerConfig, "threads"), show_default=True,
                     type=click.IntRange(1)),
        click.option("--seed", type=click.IntRange(0), help="Base seed: each request's seed derives from it and its id."),
        click.option("--n-keep", default=default_of(RunnerConfig, "n_keep"), show_default=True, type=click.IntRange(0),
                     help="Prompt tokens always kept when a window slides (besides BOS)."),
        click.option("--n-discard", default=default_of(RunnerConfig, "n_discard"), show_default=True,
                     type=click.IntRange(0), help="Tokens dropped per generation shift; 0 = half of what follows n_keep."),
        click.option("--prefix-cache/--no-prefix-cache", default=default_of(RunnerConfig, "prefix_cache"),
                     show_default=True,
                     help="Reuse prompt prefixes already computed in some slot (a shared system prompt is prefilled once)."),
        click.option("--batch-invariant", is_flag=True, default=default_of(RunnerConfig, "batch_invariant"),
                     help="Make each output independent of what runs beside it (parallelism, prefix reuse), "
                          "at some cost in speed."),
        click.option("--chat-template", metavar="NAME_OR_FILE",
                     help="Chat template for messages: a llama.cpp built-in name (chatml, gemma, llama3, ...) or a "
                          "Jinja template file. Default: the model's own."),
    ])


def overflow_option(default: OverflowPolicy) -> Callable:
    return click.option("--overflow", type=click.Choice([policy.value for policy in OverflowPolicy]),
                        default=default.value, show_default=True,
                        help="A request that does not fit its slot: slide the prompt (and shift the generation), "
                             "or reject it with an error naming the sizes.")


def sampling_options(max_tokens_default: int | None, max_tokens_help: str) -> Callable:
    return _apply([
        click.option("-n", "--max-tokens", default=max_tokens_default, show_default=max_tokens_default is not None,
                     type=click.IntRange(1), help=max_tokens_help),
        click.option("--temperature", default=default_of(SamplingParams, "temperature"), show_default=True,
                     type=click.FloatRange(0), help="0 = greedy."),
        click.option("--top-k", default=default_of(SamplingParams, "top_k"), show_default=True, type=click.IntRange(0),
                     help="0 = off."),
        click.option("--top-p", default=default_of(SamplingParams, "top_p"), show_default=True,
                     type=click.FloatRange(0, 1, min_open=True)),
        click.option("--min-p", default=default_of(SamplingParams, "min_p"), show_default=True,
                     type=click.FloatRange(0, 1)),
        click.option("--repeat-penalty", default=default_of(SamplingParams, "repeat_penalty"), show_default=True,
                     type=click.FloatRange(0, min_open=True)),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        click.option("--ignore-eos", is_flag=True, help="Never sample end-of-generation tokens."),
        click.option("--strict-schema", is_flag=True, default=default_of(SamplingParams, "strict_schema"),
                     help="Refuse a JSON schema the grammar cannot enforce exactly (naming the keyword), instead of "
                          "approximating it and validating each output; a request's own strict wins."),
    ])


def runner_config(options: dict[str, Any]) -> RunnerConfig:
    """The RunnerConfig of the engine options (a usage error when a value does not go)."""
    values = {name: options[name] for name in ENGINE_FIELDS if name in options}
    if values.get("slot_ctx") is None:
        values.pop("slot_ctx", None)
    try:
        return RunnerConfig(**values)
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def sampling_defaults(options: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**{name: options[name] for name in SAMPLING_FIELDS})
    except ValueError as error:
        raise click.UsageError(str(error)) from None
