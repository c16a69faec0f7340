"""The thread that runs batches: the oldest runnable batch first, each line through the same
translation batch-run applies to an OpenAI Batch file, at most LINES_PER_SLOT x slots lines in
the runner at once (so that interactive requests never queue behind a batch's thousands of
lines), and the batch ended (completed, cancelled or failed) with its result files published.

Exactly once across crashes: the output and error files are the record of what is done. A run
starts by cutting a torn last line, skips the custom_ids the files already hold, and submits
only the rest; a cancelled request (a cancelled batch, or a server shutting down) never gets a
line, so the next start runs it. Finished lines reach the files in groups (commits.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..formats.batchrun import BatchRun
from ..formats.lines import RawLine, decode_line, iter_lines
from ..formats.output import ResultSink, ResultWriter
from ..formats.reader import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, PromptFormat, PromptItem, line_id, parse_line
from ..formats.resume import drop_torn_tail, written_ids
from ..request import FinishReason, Priority, Request, Result
from ..loop.runner import Runner
from .batchrules import BatchRules, batch_error, new_id, now
from .commits import GroupCommitter
from .errors import INTERNAL_ERROR_MESSAGE
from .filestore import FileStore
from .store import BatchRecord, FileRecord, Store

logger = logging.getLogger("multiseq.server")

OUTPUT_PURPOSE = "batch_output"
# Batch lines in the runner per slot: one running and one ready to take the slot the moment it
# frees. More would only queue ahead of interactive requests.
LINES_PER_SLOT = 2
RUNNABLE = ("in_progress", "finalizing", "cancelling")  # what the worker takes, oldest first
OUTPUT_NAME, ERRORS_NAME = "output.jsonl", "errors.jsonl"


class ApiBatchRun(BatchRun):
    """One batch's lines through the server's runner, which interactive requests share: the
    runner's ids carry the batch's id, a cancel stops this batch's requests alone, and a
    cancelled request gets no line (it runs again when the batch resumes)."""

    def __init__(self, runner: Runner, items: Iterator[PromptItem], num_items: int, writer: ResultWriter,
                 model_name: str, window: int, id_prefix: str) -> None:
        super().__init__(runner, items, num_items, writer, PromptFormat.OPENAI, model_name, window)
        self.id_prefix = id_prefix

    def _runner_request(self, request: Request) -> Request:
        return dataclasses.replace(request, id=f"{self.id_prefix}{request.id}")

    def _cancel_open(self) -> None:
        for request_id in list(self._open):
            self.runner.cancel(request_id)

    def _leaves_unwritten(self, results: list[Result]) -> bool:
        return any(result.finish_reason is FinishReason.CANCELLED for result in results)


class ModelUnavailable(Exception):
    """The model a batch names cannot run it (it could not load): the batch fails, saying why."""


class _NoDisplay:
    """What BatchRun tells its display: nothing here (the committer records the counts)."""

    def note_written(self) -> None:
        pass

    def tick(self) -> None:
        pass


class BatchLines:
    """A batch's input lines as batch-run reads them, held to the batch: its url must be the
    batch's endpoint and its model this server's; each runs as batch work, with the server's
    rules."""

    def __init__(self, rules: BatchRules) -> None:
        self.rules = rules

    def items(self, path: Path, endpoint: str, model: str, is_done) -> Iterator[PromptItem]:
        """The lines whose custom_id is not done yet, as items (read lazily)."""
        for line in iter_lines(path):
            item_id = line_id(line, PromptFormat.OPENAI)
            if item_id is not None and not is_done(item_id):
                yield self._item(line, endpoint, model)

    def _item(self, line: RawLine, endpoint: str, model: str) -> PromptItem:
        item = parse_line(line, PromptFormat.OPENAI, self.rules.defaults)
        if not item.is_valid:
            return item
        misfit = self._misfit(line, item, endpoint, model)
        if misfit is not None:
            message, param = misfit
            return dataclasses.replace(item, request=None, error=f"line {line.number}: {message}", error_param=param)
        request = dataclasses.replace(item.request, overflow=self.rules.overflow, priority=Priority.BATCH)
        return dataclasses.replace(item, request=request)

    def _misfit(self, line: RawLine, item: PromptItem, endpoint: str, model: str) -> tuple[str, str] | None:
        url = EMBEDDINGS_URL if item.embedding_encoding is not None else CHAT_URL if item.is_chat else COMPLETIONS_URL
        if url != endpoint:
            return f"url must be {endpoint}, the batch's endpoint", "url"
        named = json.loads(decode_line(line))["body"].get("model")  # a valid line: a JSON object with a body
        if named is not None and self.rules.model_named(named) != model:
            return f"the model {json.dumps(named)} is not the batch's, {json.dumps(model)}", "model"
        return None


class BatchWorker:
    """The thread that runs the data directory's batches, one at a time, oldest first."""

    def __init__(self, store: Store, files: FileStore, rules: BatchRules) -> None:
        self.store = store
        self.files = files
        self.rules = rules
        self.batches_dir = files.data_dir / "batches"
        self.batches_dir.mkdir(exist_ok=True)  # OSError when the data directory cannot be used
        self._lines = BatchLines(rules)
        self._runner_for: Callable[[str], Runner] | None = None
        self._lock = threading.Lock()  # guards _current, _current_batch and starting
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._current: ApiBatchRun | None = None
        self._current_batch: str | None = None
        self._thread: threading.Thread | None = None

    def start(self, runner_for: Callable[[str], Runner]) -> bool:
        """Run batches from now on, each on the runner of its model (`runner_for(name)`, on this
        worker's thread: it may wait for the model to load; ModelUnavailable when it cannot);
        False when it was started or stopped before."""
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                return False
            self._runner_for = runner_for
            self._thread = threading.Thread(target=self._work, name="multiseq-batches", daemon=True)
        self._thread.start()
        return True

    def wake(self) -> None:
        """A batch may have become runnable."""
        self._wake.set()

    def stop(self) -> None:
        """Stop taking batch work: the running batch's requests are cancelled and get no line
        (it resumes at the next start). Returns at once; close() waits."""
        with self._lock:
            self._stopping.set()
            if self._current is not None:
                self._current.interrupt()
        self._wake.set()

    def close(self) -> None:
        """Stop, and wait for the thread."""
        self.stop()
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()

    def stop_or_finish(self, batch_id: str) -> None:
        """A batch now cancelling: the running one is interrupted (the worker ends it once its
        requests have ended); any other is ended here, since nothing writes its files (the
        worker runs only a batch still in progress)."""
        with self._lock:
            if self._current_batch == batch_id:
                self._current.interrupt()
                return
        self.finish(self.store.batch(batch_id), "cancelled")

    def num_waiting_lines(self, runner: Runner) -> int:
        """The running batch's requests that wait for a slot (they are not to count against
        --max-queue, which is for interactive requests)."""
        run = self._current
        if run is None or run.runner is not runner:
            return 0
        in_slots = sum(1 for slot in runner.latest_snapshot.slots
                       if slot.request_id is not None and slot.request_id.startswith(run.id_prefix))
        return max(0, run.num_open_requests - in_slots)

    def _work(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            batch = next(iter(self.store.batches_with_status(RUNNABLE)), None)
            if batch is None:
                self._wake.wait()
                continue
            try:
                self._advance(batch)
            except Exception:  # noqa: BLE001 - one batch's failure must not stop the others
                if self._stopping.is_set():
                    return  # the runner closing under a stopped batch: it resumes at the next start
                logger.exception("batch %s failed", batch.id)
                self._fail(batch.id)

    def _fail(self, batch_id: str) -> None:
        """End a batch that failed inside the server, keeping the lines it finished."""
        try:
            self.finish(self.store.batch(batch_id), "failed", [batch_error("server_error", INTERNAL_ERROR_MESSAGE)])
        except Exception:  # noqa: BLE001 - the database or the disk itself fails: leave it for the next start
            logger.exception("batch %s could not be ended as failed", batch_id)
            self._stopping.wait(1.0)  # and do not spin on it

    def _advance(self, batch: BatchRecord) -> None:
        if batch.status == "in_progress":
            try:
                runner = self._runner_for(batch.model)
            except ModelUnavailable as error:
                self.finish(batch, "failed", [batch_error("model_unavailable", str(error), "model")])
                return
            self._run(batch, runner)
            if self._stopping.is_set() or not self._is_written(batch):
                return  # in_progress still: the next start resumes it (or, its model unloaded under it, the next turn)
            self.store.move_batch(batch.id, ["in_progress"], "finalizing", now())
            batch = self.store.batch(batch.id)
        if batch.status == "finalizing":
            self.finish(batch, "completed")
        elif batch.status == "cancelling":
            self.finish(batch, "cancelled")

    def _is_written(self, batch: BatchRecord) -> bool:
        """Every line of the batch has its output or error line (a cancelled request has none):
        the counts the run's commits left in the store, not the files read again."""
        counts = self.store.batch(batch.id)
        return counts is not None and counts.completed + counts.failed >= batch.total

    def _run(self, batch: BatchRecord, runner: Runner) -> None:
        """Run the lines of the batch that have no output line yet."""
        output_path, errors_path = self._result_paths(batch.id)
        output_path.parent.mkdir(exist_ok=True)
        for path in (output_path, errors_path):
            if drop_torn_tail(path):
                logger.info("batch %s: cut a line torn by a crash from %s", batch.id, path.name)
        succeeded, num_succeeded = written_ids(output_path)
        failed, num_failed = written_ids(errors_path)
        self.store.set_counts(batch.id, num_succeeded, num_failed)
        source = self.files.path_of(self.store.file(batch.input_file_id))
        items = self._lines.items(source, batch.endpoint, batch.model,
                                  lambda item_id: item_id in succeeded or item_id in failed)
        output = ResultSink.open_file(output_path, durable=True)
        errors = ResultSink.open_file(errors_path, durable=True)
        committer = GroupCommitter(output, errors, lambda num_output, num_errors: self.store.set_counts(
            batch.id, num_succeeded + num_output, num_failed + num_errors))
        try:
            writer = ResultWriter(committer.output, keep_input_order=False, errors_sink=committer.errors)
            run = ApiBatchRun(runner, items, max(0, batch.total - num_succeeded - num_failed), writer,
                              batch.model, LINES_PER_SLOT * runner.config.parallel, f"{batch.id}/")
            with self._lock:
                if self._stopping.is_set() or self.store.batch(batch.id).status != "in_progress":
                    return  # stopped, or cancelled before it started
                self._current, self._current_batch = run, batch.id
            run.execute(_NoDisplay())
        finally:
            try:
                committer.close()  # every finished line on disk before anyone may end the batch
            finally:
                with self._lock:
                    self._current = self._current_batch = None
                output.close()
                errors.close()

    def finish(self, batch: BatchRecord, status: str, errors: list[dict[str, Any]] | None = None) -> None:
        """End the batch: its output and error files (when they have lines) become files of the
        Files API, and the counts are taken from them."""
        outputs, changes = [], {}
        counts = {}
        for kind, path in zip(("output", "error"), self._result_paths(batch.id)):
            drop_torn_tail(path)
            _, num_lines = written_ids(path)
            counts[kind] = num_lines
            if num_lines:
                record = FileRecord(new_id("file-"), f"{batch.id}_{kind}.jsonl", OUTPUT_PURPOSE, path.stat().st_size,
                                    now(), str(path.relative_to(self.files.data_dir)))
                outputs.append(record)
                changes[f"{kind}_file_id"] = record.id
        if errors is not None:
            changes["errors"] = errors
        self.store.finish_batch(batch.id, batch.status, status, now(), outputs, completed=counts["output"],
                                failed=counts["error"], **changes)

    def _result_paths(self, batch_id: str) -> tuple[Path, Path]:
        folder = self.batches_dir / batch_id
        return folder / OUTPUT_NAME, folder / ERRORS_NAME
