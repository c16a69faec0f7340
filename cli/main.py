"""The `multiseq` command: batch-run a prompts file, and manage the model registry."""

from __future__ import annotations

import json
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

from .. import models
from ..runner import BackendError, Result, Runner, RunnerConfig, SamplingParams
from ..runner.config import OverflowPolicy, default_of
from .dashboard import REFRESH_SECONDS, open_display
from .reader import PromptFormat, PromptItem, TextMode, detect_format, duplicate_ids, read_prompts
from .records import ResultWriter, keep_succeeded_lines, record_for
from .summary import render_summary, summarize

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
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp warnings.")
def batch_run(prompts_file: Path, output: Path | None, prompt_format: str | None, text_mode: str, model: str,
              parallel: int, slot_ctx: int, max_tokens: int, temperature: float, top_k: int, top_p: float,
              min_p: float, repeat_penalty: float, seed: int | None, stop: tuple[str, ...], ignore_eos: bool,
              threads: int, n_keep: int, n_discard: int, overflow: str, prefix_cache: bool, batch_invariant: bool,
              order: str, errors_file: Path | None, resume: bool, strict: bool, stats_json: Path | None,
              dashboard: bool | None, verbose: bool) -> None:
    """Run every prompt in PROMPTS_FILE and write one result per line.

    PROMPTS_FILE is JSON lines ({"id"?, "prompt" | "messages", ...}), plain text (one prompt
    per line) or an OpenAI Batch API input file; results follow the same format (OpenAI Batch
    output for OpenAI input); --errors FILE puts the failed lines in FILE (rewritten on each
    run, --resume included). A summary goes to standard error. Exit code: 0 when every item
    succeeded, 1 when some failed or were cancelled, 2 for a usage or input error, 130 when
    interrupted."""
    logging.getLogger("multiseq.llama").setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p, repeat_penalty=repeat_penalty, stop=stop, ignore_eos=ignore_eos)
        config = RunnerConfig(model=model, parallel=parallel, slot_ctx=slot_ctx, threads=threads, n_keep=n_keep,
                              n_discard=n_discard, overflow=overflow, seed=seed, prefix_cache=prefix_cache,
                              batch_invariant=batch_invariant)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    if resume and output is None:
        raise click.UsageError("--resume needs --output: the file to resume")
    file_format = PromptFormat(prompt_format) if prompt_format else detect_format(prompts_file)
    items = read_prompts(prompts_file, file_format, defaults, TextMode(text_mode))
    _check_items(items, strict)
    done_ids = keep_succeeded_lines(output) if resume else set()
    pending = [item for item in items if item.id not in done_ids]
    resolved = _resolve_model(model)
    try:
        runner = Runner(config)
    except (BackendError, models.ModelError) as error:
        raise click.ClickException(str(error)) from None
    with runner:
        skipped = f", {len(items) - len(pending)} already done" if resume else ""
        allocated = runner.backend.allocated_window
        rounding = f" (llama.cpp allocates {allocated})" if allocated != runner.window else ""
        stderr.print(f"[bold]multiseq[/] {resolved.name}: {parallel} slots x {runner.window} tokens{rounding}, "
                     f"{threads} threads, {len(pending)} {file_format.value} prompts{skipped}")
        with _open_output(output, append=resume) as stream, _open_errors(errors_file) as errors_stream:
            writer = ResultWriter(stream, [item.id for item in pending], keep_input_order=order == "input",
                                  errors_stream=errors_stream)
            run = BatchRun(runner, pending, writer, file_format, resolved.name)
            with open_display(len(pending), runner, stderr, dashboard) as display:
                results, interrupted, wall = run.execute(display)
        summary = summarize(results, sum(not item.is_valid for item in pending), runner.stats(), wall)
    stderr.print(render_summary(summary))
    if stats_json:
        stats_json.write_text(json.dumps(summary, indent=2) + "\n")
    if interrupted:
        stderr.print("[yellow]interrupted: finished and partial results were written[/]")
        sys.exit(EXIT_INTERRUPTED)
    if summary["failed"] or summary["cancelled"]:
        sys.exit(EXIT_SOME_FAILED)


def _check_items(items: list[PromptItem], strict: bool) -> None:
    """Problems with the file as a whole stop the run before anything runs."""
    duplicates = duplicate_ids(items)
    if duplicates:
        raise click.UsageError("duplicate ids in the input: " + "; ".join(duplicates[:5]))
    bad = [item.error for item in items if not item.is_valid]
    if strict and bad:
        raise click.UsageError(f"{len(bad)} bad line(s), nothing was run (--strict):\n" + "\n".join(bad[:20]))


@contextmanager
def _open_output(output: Path | None, append: bool):
    if output is None:
        yield sys.stdout
    else:
        with output.open("a" if append else "w", encoding="utf-8") as stream:
            yield stream


@contextmanager
def _open_errors(errors_file: Path | None):
    """The --errors file, or None (failed lines then go with the results)."""
    if errors_file is None:
        yield None
    else:
        with errors_file.open("w", encoding="utf-8") as stream:
            yield stream


class BatchRun:
    """One batch-run: submit every valid item, write each result as it arrives; the first
    Ctrl-C cancels everything (partial results are still written), a second exits at once."""

    def __init__(self, runner: Runner, items: list[PromptItem], writer: ResultWriter, file_format: PromptFormat,
                 model_name: str) -> None:
        self.runner = runner
        self.items = items
        self.writer = writer
        self.file_format = file_format
        self.model_name = model_name
        self.finished: queue.SimpleQueue = queue.SimpleQueue()  # SimpleQueue.put is safe in a signal handler
        self.interrupted = False

    def _on_sigint(self, _signum, _frame) -> None:
        if self.interrupted:
            os._exit(EXIT_INTERRUPTED)
        self.interrupted = True
        self.finished.put(_INTERRUPT)

    def execute(self, display) -> tuple[list[Result], bool, float]:
        in_main_thread = threading.current_thread() is threading.main_thread()  # signals need the main thread
        previous_handler = signal.signal(signal.SIGINT, self._on_sigint) if in_main_thread else None
        started = time.perf_counter()
        try:
            results = self._collect(display)
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous_handler)
            self.writer.flush_pending()
        return results, self.interrupted, time.perf_counter() - started

    def _collect(self, display) -> list[Result]:
        """Submit every choice of every valid item; write an item once all its choices ended."""
        item_of = {request_id: item for item in self.items for request_id in item.request_ids}
        choices: dict[str, dict[str, Result]] = {item.id: {} for item in self.items}
        for item in self.items:
            if not item.is_valid:
                self._write(item, None, display)
        requests = [request for item in self.items for request in item.requests]
        for request in requests:
            self.runner.submit(request, on_finish=self.finished.put)
        results: list[Result] = []
        while len(results) < len(requests):
            try:
                message = self.finished.get(timeout=REFRESH_SECONDS)
            except queue.Empty:
                display.tick()
                continue
            if message is _INTERRUPT:
                self.runner.cancel_all()
                continue
            results.append(message)
            item = item_of[message.id]
            choices[item.id][message.id] = message
            if len(choices[item.id]) == item.n:
                self._write(item, [choices[item.id][request_id] for request_id in item.request_ids], display)
        return results

    def _write(self, item: PromptItem, results: list[Result] | None, display) -> None:
        self.writer.write(record_for(self.file_format, item, results, self.model_name))
        display.note_written()
        display.tick()


if __name__ == "__main__":
    cli()
