"""The `multiseq` command: batch-run a prompts file, and manage the model registry."""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

import models
from cli.prompts import PromptItem, ResultWriter, item_error_record, read_jsonl, result_record
from cli.summary import render_summary, summarize
from runner import BackendError, Result, Runner, RunnerConfig, SamplingParams
from runner.config import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, OverflowPolicy

EXIT_SOME_FAILED = 1
EXIT_INTERRUPTED = 130
_INTERRUPT = object()

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


def _fetch_with_progress(name: str, force: bool = False) -> Path:
    try:
        with _fetch_progress() as report:
            return models.fetch(name, force=force, progress=report)
    except models.ModelError as error:
        raise click.ClickException(str(error)) from None


def _resolve_model(name: str) -> models.ResolvedModel:
    try:
        with _fetch_progress() as report:
            return models.resolve(name, progress=report)
    except models.ModelError as error:
        raise click.ClickException(str(error)) from None


# --- batch-run -----------------------------------------------------------------------------

@cli.command("batch-run")
@click.argument("prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Results file (JSON lines). Default: standard output.")
@click.option("-m", "--model", default=models.DEFAULT_MODEL, show_default=True,
              help="Registry model name or path to a .gguf file.")
@click.option("-np", "--parallel", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Sequences decoded together (slots).")
@click.option("--slot-ctx", default=2048, show_default=True, type=click.IntRange(16),
              help="Context tokens per slot (prompt + generation).")
@click.option("-n", "--max-tokens", default=256, show_default=True, type=click.IntRange(1), help="Tokens to generate.")
@click.option("--temperature", default=DEFAULT_TEMPERATURE, show_default=True, type=click.FloatRange(0),
              help="0 = greedy.")
@click.option("--top-k", default=DEFAULT_TOP_K, show_default=True, type=click.IntRange(0), help="0 = off.")
@click.option("--top-p", default=DEFAULT_TOP_P, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--min-p", default=DEFAULT_MIN_P, show_default=True, type=click.FloatRange(0, 1))
@click.option("--repeat-penalty", default=1.0, show_default=True, type=click.FloatRange(0, min_open=True))
@click.option("--seed", type=click.IntRange(0), help="Base seed: each request's seed derives from it and its id.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Never sample end-of-generation tokens.")
@click.option("-t", "--threads", default=os.cpu_count() or 1, show_default=True, type=click.IntRange(1))
@click.option("--n-keep", default=0, show_default=True, type=click.IntRange(0),
              help="Prompt tokens always kept when a window slides (besides BOS).")
@click.option("--n-discard", default=0, show_default=True, type=click.IntRange(0),
              help="Tokens dropped per generation shift; 0 = half of what follows n_keep.")
@click.option("--overflow", type=click.Choice([policy.value for policy in OverflowPolicy]), default="slide",
              show_default=True, help="A prompt longer than the slot window: slide it, or reject it.")
@click.option("--order", type=click.Choice(["finish", "input"]), default="finish", show_default=True,
              help="Write results as they finish, or in input order.")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp warnings.")
def batch_run(prompts_file: Path, output: Path | None, model: str, parallel: int, slot_ctx: int, max_tokens: int,
              temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, seed: int | None,
              stop: tuple[str, ...], ignore_eos: bool, threads: int, n_keep: int, n_discard: int, overflow: str,
              order: str, verbose: bool) -> None:
    """Run every prompt in PROMPTS_FILE (JSON lines: {"id"?, "prompt" | "messages", ...})
    and write one result per line. A summary goes to standard error."""
    logging.getLogger("multiseq.llama").setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p, repeat_penalty=repeat_penalty, stop=stop, ignore_eos=ignore_eos)
        config = RunnerConfig(model=model, parallel=parallel, slot_ctx=slot_ctx, threads=threads, n_keep=n_keep,
                              n_discard=n_discard, overflow=overflow, seed=seed)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    items = read_jsonl(prompts_file, defaults)
    resolved = _resolve_model(model)
    try:
        runner = Runner(config)
    except (BackendError, models.ModelError) as error:
        raise click.ClickException(str(error)) from None
    with runner:
        stderr.print(f"[bold]multiseq[/] {resolved.name}: {parallel} slots x {runner.window} tokens, "
                     f"{threads} threads, {len(items)} prompts")
        with _open_output(output) as stream:
            writer = ResultWriter(stream, [item.id for item in items], keep_input_order=order == "input")
            results, interrupted, wall = _run_items(runner, items, writer)
        summary = summarize(results, sum(not item.is_valid for item in items), runner.stats(), wall)
    stderr.print(render_summary(summary))
    if interrupted:
        stderr.print("[yellow]interrupted: finished and partial results were written[/]")
        sys.exit(EXIT_INTERRUPTED)
    if summary["failed"] or summary["cancelled"]:
        sys.exit(EXIT_SOME_FAILED)


@contextmanager
def _open_output(output: Path | None):
    if output is None:
        yield sys.stdout
    else:
        with output.open("w", encoding="utf-8") as stream:
            yield stream


def _run_items(runner: Runner, items: list[PromptItem], writer: ResultWriter) -> tuple[list[Result], bool, float]:
    """Submit every valid item, write each result as it arrives; the first Ctrl-C cancels
    everything (partial results are still written), a second one exits at once."""
    finished: queue.SimpleQueue = queue.SimpleQueue()  # SimpleQueue.put is safe in a signal handler
    interrupted = False

    def on_sigint(_signum, _frame) -> None:
        nonlocal interrupted
        if interrupted:
            os._exit(EXIT_INTERRUPTED)
        interrupted = True
        finished.put(_INTERRUPT)

    in_main_thread = threading.current_thread() is threading.main_thread()  # signals need the main thread
    previous_handler = signal.signal(signal.SIGINT, on_sigint) if in_main_thread else None
    started = time.perf_counter()
    try:
        for item in items:
            if not item.is_valid:
                writer.write(item_error_record(item))
        valid = [item for item in items if item.is_valid]
        for item in valid:
            runner.submit(item.request, on_finish=finished.put)
        results = []
        while len(results) < len(valid):
            message = finished.get()
            if message is _INTERRUPT:
                runner.cancel_all()
                continue
            results.append(message)
            writer.write(result_record(message))
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous_handler)
    return results, interrupted, time.perf_counter() - started


if __name__ == "__main__":
    cli()
