"""The options batch-run and serve share: the model, the engine, sampling defaults.

Each group is a decorator; the command gets the options as keyword arguments and builds its
RunnerConfig and SamplingParams with runner_config() and sampling_defaults(). Defaults come
from the library's dataclasses (default_of), so the command line and the library agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from .. import models
from ..config import (CONTEXT_POOLINGS, DEFAULT_SLOT_CTX, KV_CACHE_TYPES, REASONING_FORMATS, SPEC_TYPES, THREADS_ENV, TOOL_FORMATS, FlashAttention, OverflowPolicy, RunnerConfig, SamplingMode, SamplingParams,
                      SplitMode, default_of)

ENGINE_FIELDS = ("model", "mmproj", "auto_mmproj", "parallel", "slot_ctx", "kv_pool", "kv_layout", "threads", "n_keep", "n_discard", "seed", "chat_template",
                 "tool_format", "reasoning_format", "reasoning_budget", "reasoning_budget_message", "cache_type_k", "cache_type_v", "prefix_cache", "cache_ram_mib", "cache_disk", "cache_disk_mib", "step_tokens", "n_batch", "batch_invariant", "overflow", "n_gpu_layers", "main_gpu", "split_mode", "tensor_split",
                 "flash_attn", "sampling", "spec_type", "spec_draft_max", "spec_draft_min", "spec_ngram_size", "pooling")
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "stop", "ignore_eos",
                   "strict_schema")


class GpuLayers(click.ParamType):
    """-ngl: a number of layers, or `all` (also -1) for every one."""

    name = "N|all"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "all":
            return -1
        try:
            layers = int(text)
        except ValueError:
            layers = None
        if layers is None or layers < -1:
            self.fail(f"{value!r} is not a number of layers >= 0, or all (-1)", param, ctx)
        return layers


class TensorSplit(click.ParamType):
    """-ts: each GPU's share of the model, as llama.cpp writes it: 3,1 (or 3/1)."""

    name = "N0,N1,..."

    def convert(self, value: Any, param, ctx) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        try:
            shares = tuple(float(part) for part in str(value).replace("/", ",").split(","))
        except ValueError:
            shares = ()
        if not shares or any(not 0 <= share < float("inf") for share in shares) or sum(shares) <= 0:
            self.fail(f"{value!r} is not a list of shares >= 0 such as 3,1", param, ctx)
        return shares


class StreamInterval(click.ParamType):
    """serve --stream-interval: seconds between a stream's chunks at least, or `auto` (None)."""

    name = "auto|SECONDS"

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum

    def convert(self, value: Any, param, ctx) -> float | None:
        if value is None or isinstance(value, float):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= self.maximum:
            self.fail(f"{value!r} is not auto or seconds from 0 to {self.maximum:g}", param, ctx)
        return seconds


def _apply(decorators: list[Callable]) -> Callable:
    def decorate(function: Callable) -> Callable:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return decorate


# The server's step budget: 16 decoding streams and one prompt chunk of 65-68 tokens. Measured
# on SmolLM2, 2 cores (bench/load.py --workloads long-prompts): see docs/server.md.
SERVE_STEP_TOKENS = 96


def engine_options(slot_ctx_help: str = "Context tokens per slot (prompt + generation).",
                   step_tokens_help: str = "Token budget of a step: every decoding token, then prompt chunks up to "
                                           "it. [default: 512, the whole batch]", many_models: bool = False) -> Callable:
    """The engine's options; many_models: -m may be given more than once (serve's, a tuple)."""
    return _apply([
        click.option("--step-tokens", type=click.IntRange(1), metavar="N", help=step_tokens_help),
        click.option("-b", "--batch-size", "n_batch", type=click.IntRange(1), metavar="N",
                     default=default_of(RunnerConfig, "n_batch"), show_default=True,
                     help="Most tokens in one llama_decode (llama.cpp's -b and -ub alike). An encoder's or a "
                          "reranker's input is computed whole in one: raise it for inputs longer than this."),
        click.option("-m", "--model", multiple=many_models, show_default=True,
                     default=(models.DEFAULT_MODEL,) if many_models else models.DEFAULT_MODEL,
                     help="Registry model name, path to a .gguf file, or a Hugging Face model: hf:OWNER/REPO[:QUANT] "
                          "or hf:OWNER/REPO/FILE.gguf." + (" More than once: each model served under its own name "
                                                           "(the first, the default, --alias's), a runner each, "
                                                           "picked by a request's `model`." if many_models else "")),
        click.option("-hf", "--hf-repo", metavar="OWNER/REPO[:QUANT]",
                     help="A Hugging Face repository's GGUF model, as llama.cpp's -hf (the same as -m hf:OWNER/REPO"
                          "[:QUANT]): QUANT (case-insensitive) by default Q4_K_M, else Q8_0, else the only one."),
        click.option("-np", "--parallel", default=default_of(RunnerConfig, "parallel"), show_default=True,
                     type=click.IntRange(1, 256), help="Sequences decoded together (slots)."),
        click.option("--slot-ctx", default=None, type=click.IntRange(16),
                     help=slot_ctx_help if "default" in slot_ctx_help else f"{slot_ctx_help} [default: {DEFAULT_SLOT_CTX}]"),
        click.option("-t", "--threads", envvar=THREADS_ENV, default=os.cpu_count() or 1, show_default="every core",
                     type=click.IntRange(1),
                     help=f"llama.cpp's threads; {THREADS_ENV} sets the default (runners sharing cores split them)."),
        click.option("--seed", type=click.IntRange(0), help="Base seed: each request's seed derives from it and its id."),
        click.option("--n-keep", default=default_of(RunnerConfig, "n_keep"), show_default=True, type=click.IntRange(0),
                     help="Prompt tokens always kept when a window slides (besides BOS)."),
        click.option("--n-discard", default=default_of(RunnerConfig, "n_discard"), show_default=True,
                     type=click.IntRange(0), help="Tokens dropped per generation shift; 0 = half of what follows n_keep."),
        click.option("--prefix-cache/--no-prefix-cache", default=default_of(RunnerConfig, "prefix_cache"),
                     show_default=True,
                     help="Reuse prompt prefixes already computed in some slot (a shared system prompt is prefilled once)."),
        click.option("--cache-ram", "cache_ram_mib", type=click.IntRange(min=0), metavar="MIB",
                     default=default_of(RunnerConfig, "cache_ram_mib"), show_default=True,
                     help="Host memory for slot states saved before their slot is reused, restored when that "
                          "conversation or prefix comes back (0: off)."),
        click.option("--cache-disk", metavar="DIR", type=click.Path(file_okay=False),
                     help="A folder for slot states leaving host memory, and at exit for every kept prefix: "
                          "restored after a restart instead of prefilled (a conversation, an agent's prompt)."),
        click.option("--cache-disk-size", "cache_disk_mib", type=click.IntRange(min=1), metavar="MIB",
                     default=default_of(RunnerConfig, "cache_disk_mib"), show_default=True,
                     help="The --cache-disk folder's bound; the least recently used states go first."),
        click.option("--batch-invariant", is_flag=True, default=default_of(RunnerConfig, "batch_invariant"),
                     help="Make each output independent of what runs beside it (parallelism, prefix reuse), "
                          "at some cost in speed."),
        click.option("--mmproj", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
                     help="The model's projector GGUF (llama.cpp's mmproj): prompts may then hold images (or audio, "
                          "where the projector reads it)."),
        click.option("--mmproj-auto/--no-mmproj", "auto_mmproj", default=True, show_default=True,
                     help="With a Hugging Face model (-hf), load the projector its repository holds for it."),
        click.option("--lora", "lora_files", metavar="FILE", multiple=True, type=click.Path(exists=True, dir_okay=False),
                     help="A LoRA adapter GGUF applied to every sequence, scale 1 (llama-server's --lora; again for "
                          "more)."),
        click.option("--lora-scaled", "lora_scaled", metavar="FILE:SCALE", multiple=True,
                     help="A LoRA adapter GGUF with its scale (llama-server's --lora-scaled; again for more)."),
        click.option("--chat-template", metavar="NAME_OR_FILE",
                     help="Chat template for messages: a llama.cpp built-in name (chatml, gemma, llama3, ...) or a "
                          "Jinja template file. Default: the model's own."),
        click.option("--tool-format", type=click.Choice(list(TOOL_FORMATS)),
                     help="The family the model writes tool calls and reasoning in (hermes, qwen3-xml, "
                          "gpt-oss, deepseek, glm, kimi, mistral, llama3, ...; `multiseq info` names the one "
                          "detected), or generic (a JSON object; for templates that know no tools). "
                          "[default: detected from the chat template]"),
        click.option("-ctk", "--cache-type-k", type=click.Choice(list(KV_CACHE_TYPES)), default="f16",
                     show_default=True, help="The KV cache's type for K (llama.cpp's names): q8_0 holds about twice "
                                             "the tokens of f16 in the same memory."),
        click.option("-ctv", "--cache-type-v", type=click.Choice(list(KV_CACHE_TYPES)), default="f16",
                     show_default=True, help="The KV cache's type for V; a quantized V needs flash attention "
                                             "(not with --batch-invariant or -fa off)."),
        click.option("--reasoning-format", type=click.Choice(list(REASONING_FORMATS)), default="auto", show_default=True,
                     help="auto: a reasoning model's thinking comes apart from its answer (reasoning_content); "
                          "none: the raw text is the answer, thinking included."),
        click.option("--reasoning-budget", type=click.IntRange(min=-1), default=default_of(RunnerConfig, "reasoning_budget"),
                     show_default=True, help="Tokens a reasoning model may think per request before its thinking is "
                     "closed and the answer follows (-1: no limit, 0: none); a request's own budget wins."),
        click.option("--reasoning-budget-message", default="", metavar="TEXT",
                     help="Text written at the end of thinking cut by the budget, before its close (llama-server's)."),
        click.option("-ngl", "--n-gpu-layers", type=GpuLayers(),
                     help="Layers stored on the GPU: a number, or all (-1). A build without a GPU backend says so "
                          "and runs on the CPU. [default: llama.cpp's, every layer on a GPU build]"),
        click.option("-mg", "--main-gpu", default=default_of(RunnerConfig, "main_gpu"), show_default=True,
                     type=click.IntRange(0), help="The GPU for the whole model with --split-mode none."),
        click.option("-sm", "--split-mode", type=click.Choice([mode.value for mode in SplitMode]),
                     default=default_of(RunnerConfig, "split_mode").value, show_default=True,
                     help="How the model is spread over several GPUs (llama.cpp's modes)."),
        click.option("-ts", "--tensor-split", type=TensorSplit(),
                     help="Each GPU's share of the model, e.g. 3,1. [default: by their memory]"),
        click.option("-fa", "--flash-attn", type=click.Choice([mode.value for mode in FlashAttention]),
                     default=default_of(RunnerConfig, "flash_attn").value, show_default=True,
                     help="Flash attention; auto lets llama.cpp decide (--batch-invariant turns it off)."),
        click.option("--sampling", type=click.Choice([mode.value for mode in SamplingMode]),
                     default=default_of(RunnerConfig, "sampling").value, show_default=True,
                     help="Where tokens are sampled: backend runs llama.cpp's sampler chains in the model's graph "
                          "for greedy and sampled requests, logit bias included (grammars, penalties, min_tokens "
                          "and logprobs stay on the host); auto is the host on a CPU build, where it is faster."),
        click.option("--spec-type", type=click.Choice(list(SPEC_TYPES)), default=default_of(RunnerConfig, "spec_type"),
                     show_default=True,
                     help="Speculative decoding from the session's own text, verified in the shared step (greedy "
                          "and seeded outputs unchanged): ngram-simple drafts from the session's prompt and output, "
                          "ngram-mod also from n-grams every session shares. Drafts go where the step's measured "
                          "cost says they pay."),
        click.option("--spec-draft-max", "--spec-draft-n-max", "spec_draft_max", type=click.IntRange(1),
                     default=default_of(RunnerConfig, "spec_draft_max"), show_default=True,
                     help="Most draft tokens verified for a sequence in one step."),
        click.option("--spec-draft-min", "--spec-draft-n-min", "spec_draft_min", type=click.IntRange(1),
                     default=default_of(RunnerConfig, "spec_draft_min"), show_default=True,
                     help="Fewest draft tokens worth verifying."),
        click.option("--spec-ngram-size-n", "spec_ngram_size", type=click.IntRange(1),
                     default=default_of(RunnerConfig, "spec_ngram_size"), show_default=True,
                     help="Tokens matched to find a draft (shorter: more drafts, fewer kept)."),
        click.option("--pooling", type=click.Choice(list(CONTEXT_POOLINGS)),
                     help="How an embedding pools its tokens' rows: mean, cls (the first token's), last, or none "
                          "(every token's row; /embedding only); rank: the model is a reranker (/v1/rerank), "
                          "its classifier head scores a query with each document. [default: as the GGUF says, "
                          "else mean]"),
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
    if options.get("lora_files") or options.get("lora_scaled"):
        values["lora"] = lora_adapters(options.get("lora_files", ()), options.get("lora_scaled", ()))
    if values.get("slot_ctx") is None:
        values.pop("slot_ctx", None)
    if options.get("hf_repo"):
        values["model"] = _hub_model(options["hf_repo"])
    elif models.hub.is_hub_name(str(values.get("model", ""))):
        _check_hub_name(values["model"], "-m/--model")
    try:
        return RunnerConfig(**values)
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def lora_adapters(files: tuple[str, ...], scaled: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """--lora FILE (scale 1) and --lora-scaled FILE:SCALE as (path, scale) pairs."""
    return (*((path, 1.0) for path in files),
            *(adapter_file(given, given, "--lora-scaled", scale_required=True) for given in scaled))


def adapter_file(text: str, given: str, option: str, scale_required: bool = False) -> tuple[str, float]:
    """An adapter's FILE:SCALE (or FILE alone at scale 1, unless the scale is required) as
    (path, scale), or a usage error naming the option and the value `given`."""
    path, colon, scale = text.rpartition(":")
    try:
        value = float(scale) if colon else None
    except ValueError:
        value = None
    if value is None:
        if scale_required:
            raise click.UsageError(f"{option} {given!r}: give FILE:SCALE, the scale a number")
        path, value = text, 1.0
    if not path or not os.path.isfile(os.path.expanduser(path)):
        raise click.UsageError(f"{option} {given!r}: {path or given!r} is not a file")
    return os.path.expanduser(path), value


def _hub_model(repo: str) -> str:
    """-hf OWNER/REPO[:QUANT] as a model name, refused beside an -m of the user's."""
    context = click.get_current_context(silent=True)
    if context is not None and context.get_parameter_source("model") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("give -m/--model or -hf/--hf-repo, not both")
    name = models.hub.PREFIX + repo.removeprefix(models.hub.PREFIX)
    _check_hub_name(name, "-hf/--hf-repo")
    return name


def _check_hub_name(name: str, option: str) -> None:
    try:
        models.hub.parse(name)
    except models.ModelError as error:
        raise click.UsageError(f"{option}: {error}") from None


def sampling_defaults(options: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**{name: options[name] for name in SAMPLING_FIELDS})
    except ValueError as error:
        raise click.UsageError(str(error)) from None
