"""One `multiseq batch-run`: the checks that run before the model loads, then the run.

Everything that can be wrong with the command (its options, the prompts file, the files it
will write) is found before the model loads, and is a click exception (one line, exit 2). How
the runner is opened is a parameter: the command opens the real model; tests open a runner on
a fake backend and go through the same steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console

from ..config import RunnerConfig, SamplingParams
from ..loop.runner import Runner
from ..llama.chat_template import load_chat_template
from ..formats.batchrun import BatchRun, RunOutcome, default_window
from ..formats.ids import IdSet
from ..formats.lines import NotTextError, sniff_text
from ..formats.output import OutputError, ResultSink, ResultWriter
from ..formats.reader import PromptFormat, PromptItem, TextMode, detect_format, read_prompts
from ..formats.resume import keep_succeeded_lines
from ..formats.scan import FileScan, scan_file
from ..formats.summary import summarize
from .dashboard import open_display
from .interrupts import EXIT_INTERRUPTED, Interrupts
from .summary import render_summary

EXIT_SOME_FAILED = 1
EXIT_USAGE = 2  # click's code for usage errors; input errors use it too: nothing ran
EXIT_OUTPUT_FAILED = 3

stderr = Console(stderr=True)


@dataclass(frozen=True)
class OpenedRunner:
    runner: Runner  # or a multiseq.ray.RayRunnerPool, which offers what a run uses of a Runner
    model_name: str
    ray_workers: int | None = None  # on Ray: the runners behind it, each with config.parallel slots


class InputError(click.ClickException):
    """The prompts file cannot be run (not text, duplicate ids, bad lines with --strict)."""

    exit_code = EXIT_USAGE


class OutputFailed(click.ClickException):
    """Results could not be written mid-run."""

    exit_code = EXIT_OUTPUT_FAILED


@dataclass(frozen=True)
class BatchJob:
    """What batch-run was asked to do, and the steps that do it: every check that can fail
    runs before the model loads."""

    prompts_file: Path
    output: Path | None
    prompt_format: PromptFormat | None
    text_mode: TextMode
    defaults: SamplingParams
    config: RunnerConfig
    keep_input_order: bool
    resume: bool
    strict: bool
    stats_json: Path | None
    dashboard: bool | None
    open_runner: Callable[[RunnerConfig], OpenedRunner]
    errors_file: Path | None = None  # failed lines go here, as OpenAI's error file (None: with the results)
    media_root: Path | None = None  # where images the lines name are read (None: the prompts file's folder)

    def run(self, interrupts: Interrupts) -> int:
        """The exit code (errors before the run are raised as click exceptions)."""
        if self.resume and self.output is None:
            raise click.UsageError("--resume needs --output: the file to resume")
        if self.config.chat_template:
            check_chat_template(self.config.chat_template)
        if self.output is not None:
            check_writable(self.output, "-o/--output", self.prompts_file)
        if self.stats_json is not None:
            check_writable(self.stats_json, "--stats-json")
        if self.errors_file is not None:
            check_writable(self.errors_file, "--errors", self.prompts_file)
        file_format, scan = self._scan_input()
        done = self._keep_done(scan) if self.resume else IdSet()
        sink = self._open_results()
        errors_sink = self._open_errors()
        try:
            return self._run_model(file_format, scan, done, sink, errors_sink, interrupts)
        finally:
            sink.close()
            if errors_sink is not None:
                errors_sink.close()

    def _scan_input(self) -> tuple[PromptFormat, FileScan]:
        try:
            return self._check_input()
        except NotTextError as error:
            raise InputError(str(error)) from None
        except OSError as error:
            raise InputError(f"cannot read {self.prompts_file}: {error.strerror or error}") from None

    def _check_input(self) -> tuple[PromptFormat, FileScan]:
        sniff_text(self.prompts_file)
        file_format = self.prompt_format or detect_format(self.prompts_file)
        scan = scan_file(self.prompts_file, file_format, self.strict, self.defaults, self.text_mode,
                         keep_id_hashes=self.resume, media_root=self.media_root)
        if scan.duplicates:
            raise InputError("duplicate ids in the input: " + "; ".join(scan.duplicates))
        if self.strict and scan.num_bad:
            more = f"\n... and {scan.num_bad - len(scan.bad_lines)} more" if scan.num_bad > len(scan.bad_lines) else ""
            raise InputError(f"{scan.num_bad} bad line(s), nothing was run (--strict):\n"
                             + "\n".join(scan.bad_lines) + more)
        return file_format, scan

    def _keep_done(self, scan: FileScan) -> IdSet:
        """--resume: the ids the output already holds as successes (the output keeps only those)."""
        try:
            done = keep_succeeded_lines(self.output)
        except OSError as error:
            raise click.UsageError(f"cannot rewrite -o/--output {self.output}: {error.strerror or error}") from None
        scan.count_done(done)
        return done

    def _open_results(self) -> ResultSink:
        if self.output is None:
            return ResultSink.stdout()
        try:
            return ResultSink.open_file(self.output)
        except OSError as error:
            raise click.UsageError(f"cannot write -o/--output {self.output}: {error.strerror or error}") from None

    def _open_errors(self) -> ResultSink | None:
        if self.errors_file is None:
            return None
        try:
            return ResultSink.open_file(self.errors_file)
        except OSError as error:
            raise click.UsageError(f"cannot write --errors {self.errors_file}: {error.strerror or error}") from None

    def _items(self, file_format: PromptFormat, done: IdSet) -> Iterator[PromptItem]:
        items = read_prompts(self.prompts_file, file_format, self.defaults, self.text_mode, self.media_root)
        return (item for item in items if item.id not in done) if len(done) else items

    def _run_model(self, file_format: PromptFormat, scan: FileScan, done: IdSet, sink: ResultSink,
                   errors_sink: ResultSink | None, interrupts: Interrupts) -> int:
        with interrupts.held() as held:
            opened = self.open_runner(self.config)
        if held.interrupted:  # nothing ran yet: the runner is closed, and the command says so
            opened.runner.close()
            raise KeyboardInterrupt
        with opened.runner as runner:
            _print_header(opened, file_format, scan, self.resume)
            writer = ResultWriter(sink, self.keep_input_order, errors_sink)
            run = BatchRun(runner, self._items(file_format, done), scan.num_to_run, writer, file_format,
                           opened.model_name, default_window(runner.config.parallel * (opened.ray_workers or 1)))
            try:
                sink.start(keep_existing=self.resume)
                if errors_sink is not None:
                    errors_sink.start(keep_existing=False)  # the failures of this run only
                interrupts.listen(run.interrupt)
                with open_display(scan.num_to_run, runner, stderr, self.dashboard) as display:
                    outcome = run.execute(display)
            except OutputError as error:
                raise OutputFailed(f"{error}; the run stopped ({writer.num_written} result lines were written)") from None
            except OSError as error:  # the prompts file, read as the run goes
                raise click.ClickException(f"cannot read {self.prompts_file}: {error.strerror or error}; the run "
                                           f"stopped ({writer.num_written} result lines were written)") from None
            summary = summarize(outcome.tally, runner.stats(), outcome.wall_s)
        return self._report(summary, outcome)

    def _report(self, summary: dict, outcome: RunOutcome) -> int:
        stderr.print(render_summary(summary))
        if self.stats_json:
            try:
                self.stats_json.write_text(json.dumps(summary, indent=2) + "\n")
            except OSError as error:
                raise OutputFailed(f"cannot write --stats-json {self.stats_json}: {error.strerror or error}") from None
        if outcome.engine_failure is not None:
            not_started = summary["not_started"]
            later = f"; {not_started} not started" if not_started else ""
            stderr.print(f"[red]the engine stopped: {outcome.engine_failure}[/]: the results that ended were "
                         f"written{later} (--resume runs them and the failed ones)", soft_wrap=True)
            return EXIT_SOME_FAILED
        if outcome.interrupted:
            not_started = summary["not_started"]
            later = f"; {not_started} not started (--resume runs them)" if not_started else ""
            stderr.print(f"[yellow]interrupted: finished and partial results were written{later}[/]", soft_wrap=True)
            return EXIT_INTERRUPTED
        return EXIT_SOME_FAILED if summary["failed"] or summary["cancelled"] else 0


def _print_header(opened: OpenedRunner, file_format: PromptFormat, scan: FileScan, resume: bool) -> None:
    runner, config = opened.runner, opened.runner.config
    skipped = f", {scan.num_done} already done" if resume else ""
    rounding = f" (llama.cpp allocates {runner.allocated_window})" if runner.allocated_window != runner.window else ""
    workers, each = ("", "") if opened.ray_workers is None else (f"{opened.ray_workers} Ray workers x ", " each")
    device = getattr(runner, "device", None)
    where = f" on {device}" if device else ""
    stderr.print(f"[bold]multiseq[/] {opened.model_name}{where}: {workers}{config.parallel} slots x {runner.window} "
                 f"tokens{rounding}, {config.threads} threads{each}, {scan.num_to_run} {file_format.value} "
                 f"prompts{skipped}", soft_wrap=True)


def check_chat_template(value: str) -> None:
    """An unknown template name or a bad template file is a usage error, before the model loads."""
    from ..llama.backend import builtin_chat_templates  # loads llama.cpp's library, not a model

    try:
        load_chat_template(value, builtin_chat_templates())
    except ValueError as error:
        raise click.UsageError(f"--chat-template: {error}") from None


def check_writable(path: Path, option: str, prompts_file: Path | None = None) -> None:
    """A file the run will write must be writable before anything runs (its folder exists and
    may be written, the file itself if it exists may be written, and it is not the input).
    Nothing is created or changed here."""
    folder = path.parent if str(path.parent) else Path(".")
    problem = None
    if not folder.is_dir():
        problem = f"the folder {folder} does not exist"
    elif path.exists() and not os.access(path, os.W_OK):
        problem = "permission denied"
    elif not path.exists() and not os.access(folder, os.W_OK | os.X_OK):
        problem = f"permission denied in the folder {folder}"
    elif prompts_file is not None and path.exists() and path.samefile(prompts_file):
        problem = "it is the prompts file"
    if problem:
        raise click.UsageError(f"cannot write {option} {path}: {problem}")
