"""The `multiseq` command: batch-run a prompts file, and manage the model registry."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from .. import models
from ..runner import BackendError, Runner, RunnerConfig, SamplingParams
from ..runner.config import OverflowPolicy, default_of
from .interrupts import EXIT_INTERRUPTED, Interrupts
from .job import BatchJob, OpenedRunner
from ..formats.reader import PromptFormat, TextMode

stderr = Console(stderr=True)


@click.group()
@click.version_option(package_name="multiseq")
def cli() -> None:
    """multiseq: run many prompts at once over one llama.cpp context."""


# --- models --------------------------------------------------------------------------------

@cli.group("models")
def models_group() -> None:
    """The registry of small GGUF models carried by PyPI packages."""


@models_group.command("list")
def models_list() -> None:
    """List registry models and whether each is fetched."""
    table = Table("name", "size", "fetched", "description")
    for spec in models.MODELS.values():
        fetched = "yes" if models.local_path(spec).exists() else "no"
        default = " (default)" if spec.name == models.DEFAULT_MODEL else ""
        table.add_row(spec.name + default, f"{spec.size_bytes / 1e6:.0f} MB", fetched, spec.description)
    Console().print(table)


@models_group.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--all", "fetch_all", is_flag=True, help="Fetch every registry model.")
@click.option("--force", is_flag=True, help="Fetch again even if the file is in place.")
def models_fetch(names: tuple[str, ...], fetch_all: bool, force: bool) -> None:
    """Fetch models from their PyPI packages into the models folder (checked by sha256)."""
    wanted = list(models.MODELS) if fetch_all else list(names)
    if not wanted:
        raise click.UsageError("name a model to fetch, or pass --all")
    for name in wanted:
        path = _fetch_with_progress(name, force=force)
        stderr.print(f"{name}: {path}")


@models_group.command("path")
@click.argument("name")
def models_path(name: str) -> None:
    """Print the local path of a model (fetching it first if needed)."""
    click.echo(_resolve_model(name).path)


@contextmanager
def _fetch_progress():
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        console=stderr, transient=True)
    tasks: dict[str, int] = {}

    def report(update: models.FetchProgress) -> None:
        key = f"{update.model} {update.phase}"
        if key not in tasks:
            tasks[key] = progress.add_task(f"{update.model}: {update.phase}", total=update.total_bytes)
        progress.update(tasks[key], completed=update.done_bytes,
                        description=f"{update.model}: {update.phase} {update.detail}")

    with progress:
        yield report


def _with_fetch_progress(call):
    """Run a models call that may fetch, showing its progress; its error becomes one line."""
    try:
        with _fetch_progress() as report:
            return call(report)
    except models.ModelError as error:
        raise click.ClickException(str(error)) from None


def _fetch_with_progress(name: str, force: bool = False) -> Path:
    return _with_fetch_progress(lambda report: models.fetch(name, force=force, progress=report))


def _resolve_model(name: str) -> models.ResolvedModel:
    return _with_fetch_progress(lambda report: models.resolve(name, progress=report))


# --- batch-run -----------------------------------------------------------------------------

@cli.command("batch-run")
@click.argument("prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Results file (JSON lines). Default: standard output.")
@click.option("--format", "prompt_format", type=click.Choice([f.value for f in PromptFormat]),
              help="Input format; detected from the file when not given.")
@click.option("--text-mode", type=click.Choice([m.value for m in TextMode]), default="chat", show_default=True,
              help="Plain-text lines as chat messages, or as raw text to continue.")
@click.option("-m", "--model", default=models.DEFAULT_MODEL, show_default=True,
              help="Registry model name or path to a .gguf file.")
@click.option("-np", "--parallel", default=default_of(RunnerConfig, "parallel"), show_default=True, type=click.IntRange(1, 256),
              help="Sequences decoded together (slots).")
@click.option("--slot-ctx", default=default_of(RunnerConfig, "slot_ctx"), show_default=True, type=click.IntRange(16),
              help="Context tokens per slot (prompt + generation).")
@click.option("-n", "--max-tokens", default=default_of(SamplingParams, "max_tokens"), show_default=True, type=click.IntRange(1), help="Tokens to generate.")
@click.option("--temperature", default=default_of(SamplingParams, "temperature"), show_default=True, type=click.FloatRange(0),
              help="0 = greedy.")
@click.option("--top-k", default=default_of(SamplingParams, "top_k"), show_default=True, type=click.IntRange(0), help="0 = off.")
@click.option("--top-p", default=default_of(SamplingParams, "top_p"), show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--min-p", default=default_of(SamplingParams, "min_p"), show_default=True, type=click.FloatRange(0, 1))
@click.option("--repeat-penalty", default=default_of(SamplingParams, "repeat_penalty"), show_default=True, type=click.FloatRange(0, min_open=True))
@click.option("--seed", type=click.IntRange(0), help="Base seed: each request's seed derives from it and its id.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Never sample end-of-generation tokens.")
@click.option("-t", "--threads", default=default_of(RunnerConfig, "threads"), show_default=True, type=click.IntRange(1))
@click.option("--n-keep", default=default_of(RunnerConfig, "n_keep"), show_default=True, type=click.IntRange(0),
              help="Prompt tokens always kept when a window slides (besides BOS).")
@click.option("--n-discard", default=default_of(RunnerConfig, "n_discard"), show_default=True, type=click.IntRange(0),
              help="Tokens dropped per generation shift; 0 = half of what follows n_keep.")
@click.option("--overflow", type=click.Choice([policy.value for policy in OverflowPolicy]), default=default_of(RunnerConfig, "overflow").value,
              show_default=True, help="A prompt longer than the slot window: slide it, or reject it.")
@click.option("--prefix-cache/--no-prefix-cache", default=default_of(RunnerConfig, "prefix_cache"), show_default=True,
              help="Reuse prompt prefixes already computed in some slot (a shared system prompt is prefilled once).")
@click.option("--batch-invariant", is_flag=True, default=default_of(RunnerConfig, "batch_invariant"),
              help="Make each output independent of what runs beside it (parallelism, prefix reuse), "
                   "at some cost in speed.")
@click.option("--order", type=click.Choice(["finish", "input"]), default="finish", show_default=True,
              help="Write results as they finish, or in input order.")
@click.option("--errors", "errors_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write failed lines here instead of with the results (as OpenAI's error file).")
@click.option("--resume", is_flag=True, help="Skip ids already finished in --output; run the rest and append.")
@click.option("--strict", is_flag=True, help="Stop before running if any line is bad.")
@click.option("--stats-json", type=click.Path(dir_okay=False, path_type=Path), help="Write the run summary as JSON.")
@click.option("--dashboard/--no-dashboard", default=None,
              help="Live view of the slots. Default: on when standard error is a terminal.")
@click.option("--chat-template", metavar="NAME_OR_FILE",
              help="Chat template for messages: a llama.cpp built-in name (chatml, gemma, llama3, ...) or a "
                   "Jinja template file. Default: the model's own.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Spread the rows over Ray actors, each a runner with -np slots and -t threads: on a local "
                   "Ray started on this machine, or on the cluster at ADDRESS. Needs multiseq[ray].")
@click.option("--workers", type=click.IntRange(1), help="Ray actors (with --ray). Default: 1.")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp warnings.")
def batch_run(prompts_file: Path, output: Path | None, prompt_format: str | None, text_mode: str, model: str,
              parallel: int, slot_ctx: int, max_tokens: int, temperature: float, top_k: int, top_p: float,
              min_p: float, repeat_penalty: float, seed: int | None, stop: tuple[str, ...], ignore_eos: bool,
              threads: int, n_keep: int, n_discard: int, overflow: str, prefix_cache: bool, batch_invariant: bool,
              order: str, errors_file: Path | None, resume: bool, strict: bool, stats_json: Path | None,
              dashboard: bool | None, chat_template: str | None, ray_address: str | None, workers: int | None,
              verbose: bool) -> None:
    """Run every prompt in PROMPTS_FILE and write one result per line.

    PROMPTS_FILE is JSON lines ({"id"?, "prompt" | "messages", ...}), plain text (one prompt
    per line) or an OpenAI Batch API input file, of any size: it is read as the run goes. Results
    follow the same format (OpenAI Batch output for OpenAI input); --errors FILE puts the failed
    lines in FILE (rewritten on each run, --resume included). A summary goes to standard error.
    Exit code: 0 when every item succeeded, 1 when some failed or were cancelled, 2 for a usage
    or input error (nothing ran), 3 when results could not be written (the run stopped), 130
    when interrupted."""
    logging.getLogger("multiseq.llama").setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p, repeat_penalty=repeat_penalty, stop=stop, ignore_eos=ignore_eos)
        config = RunnerConfig(model=model, parallel=parallel, slot_ctx=slot_ctx, threads=threads, n_keep=n_keep,
                              n_discard=n_discard, overflow=overflow, seed=seed, chat_template=chat_template,
                              prefix_cache=prefix_cache, batch_invariant=batch_invariant)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    open_runner = _open_runner
    if ray_address is not None:
        if dashboard:
            raise click.UsageError("--dashboard shows the slots of one runner; with --ray a progress bar shows the run")
        dashboard = False
        open_runner = _ray_runner_opener(None if ray_address == "local" else ray_address, workers or 1)
    elif workers is not None:
        raise click.UsageError("--workers needs --ray")
    job = BatchJob(prompts_file, output, PromptFormat(prompt_format) if prompt_format else None, TextMode(text_mode),
                   defaults, config, order == "input", resume, strict, stats_json, dashboard, open_runner,
                   errors_file)
    with Interrupts() as interrupts:
        try:
            code = job.run(interrupts)
        except KeyboardInterrupt:  # before the run started: nothing to save
            stderr.print("[yellow]interrupted before anything ran[/]")
            code = EXIT_INTERRUPTED
    if code:
        sys.exit(code)


def _open_runner(config: RunnerConfig) -> OpenedRunner:
    """The real runner: the model fetched if needed (with progress), loaded, and a context on it."""
    resolved = _resolve_model(config.model)
    try:
        return OpenedRunner(Runner(config), resolved.name)
    except (BackendError, models.ModelError) as error:
        raise click.ClickException(str(error)) from None


def _ray_runner_opener(address: str | None, workers: int):
    """Opens the runners of a --ray run: Ray joined (or started), then `workers` actors that
    each load the model (fetching it on their node if needed)."""
    def open_ray_runner(config: RunnerConfig) -> OpenedRunner:
        try:
            from .. import ray as multiseq_ray
        except ImportError as error:
            raise click.ClickException(str(error)) from None
        try:
            multiseq_ray.connect(address)
            multiseq_ray.check_cpus(workers, config.threads)
            pool = multiseq_ray.RayRunnerPool(config, workers)
        except multiseq_ray.RayError as error:
            raise click.ClickException(str(error)) from None
        return OpenedRunner(pool, pool.model_name, ray_workers=workers)
    return open_ray_runner


if __name__ == "__main__":
    cli()
