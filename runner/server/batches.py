"""The Files and Batch APIs' work: files kept on disk, batches validated, run below interactive
requests, and resumed after a restart.

A batch goes validating -> in_progress -> finalizing -> completed (failed when its input is
not a batch file; cancelling -> cancelled when asked). One worker thread runs the batches in
the order they were created, each line through the same translation batch-run applies to an
OpenAI Batch file (multiseq.formats: reader, records, openai_output, batchrun), and at most
LINES_PER_SLOT x slots lines are in the runner at once, so that interactive requests never
queue behind a batch's thousands of lines.

Durability: each output line is appended to the batch's output or error file and fsynced as
its request finishes; the database says which batch is where. After a crash, the run starts
again from the files: a torn last line is cut, the custom_ids already written are skipped, and
only the rest is submitted, so each custom_id is written once. Cancelled requests (a cancelled
batch, or a server shutting down) are never written: a cancelled batch keeps the lines that
finished, and a batch stopped by a shutdown runs its missing lines at the next start.

Data directory layout: multiseq.db, files/<file id> (uploads), batches/<batch id>/output.jsonl
and errors.jsonl (published as files when the batch ends).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..formats.batchrun import BatchRun
from ..formats.lines import NotTextError, RawLine, count_items, decode_line, iter_lines, sniff_text
from ..formats.output import ResultSink, ResultWriter
from ..formats.reader import CHAT_URL, COMPLETIONS_URL, PromptFormat, PromptItem, TextMode, line_id, parse_line
from ..formats.resume import drop_torn_tail, written_ids
from ..formats.scan import scan_file
from ..runner import FinishReason, OverflowPolicy, Priority, Request, Result, Runner, SamplingParams
from .errors import INTERNAL_ERROR_MESSAGE, NOT_FOUND, ApiError
from .store import BatchRecord, FileRecord, Page, Store, StoreError
from .uploads import UPLOAD_PREFIX, Upload

logger = logging.getLogger("multiseq.server")

ENDPOINTS = (CHAT_URL, COMPLETIONS_URL)
COMPLETION_WINDOW = "24h"  # the only one OpenAI offers; here a batch runs to its end whatever it says
COMPLETION_WINDOW_SECONDS = 24 * 3600
BATCH_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
# Batch lines in the runner per slot: one running and one ready to take the slot the moment it
# frees. More would only queue ahead of interactive requests.
LINES_PER_SLOT = 2
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
RUNNABLE = ("in_progress", "finalizing", "cancelling")  # what the worker takes, oldest first
OUTPUT_NAME, ERRORS_NAME = "output.jsonl", "errors.jsonl"


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


@dataclass(frozen=True)
class BatchRules:
    """How batch lines run: what the server applies to its interactive requests too."""

    model_name: str
    defaults: SamplingParams
    overflow: OverflowPolicy
    max_lines: int  # requests a batch may hold


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


class _Progress:
    """What BatchRun tells its display: here, the batch's request_counts as lines are written."""

    def __init__(self, store: Store, batch_id: str, output: ResultSink, errors: ResultSink, num_succeeded: int,
                 num_failed: int) -> None:
        self._store, self._batch_id = store, batch_id
        self._output, self._errors = output, errors
        self._base = (num_succeeded, num_failed)  # lines written before this run

    def note_written(self) -> None:
        self._store.set_counts(self._batch_id, self._base[0] + self._output.num_lines,
                               self._base[1] + self._errors.num_lines)

    def tick(self) -> None:
        pass


class BatchService:
    """Files and batches in one data directory, and the thread that runs the batches."""

    def __init__(self, data_dir: Path, rules: BatchRules) -> None:
        self.data_dir = data_dir
        self.store = Store.open(data_dir)  # StoreError when the folder cannot be used
        self.files_dir = data_dir / "files"
        self.batches_dir = data_dir / "batches"
        try:
            self.files_dir.mkdir(exist_ok=True)
            self.batches_dir.mkdir(exist_ok=True)
            for leftover in self.files_dir.glob(f"{UPLOAD_PREFIX}*"):  # an upload a crash cut short
                leftover.unlink(missing_ok=True)
        except OSError as error:
            self.store.close()
            raise StoreError(f"cannot use the data directory {data_dir}: {error}") from None
        self.rules = rules
        self._runner: Runner | None = None
        self._lock = threading.Lock()  # guards _current, _validating and starting
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._current: ApiBatchRun | None = None
        self._current_batch: str | None = None
        self._validating: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._worker: threading.Thread | None = None

    # --- files ------------------------------------------------------------------------------

    def add_upload(self, upload: Upload, purpose: str) -> FileRecord:
        """The upload under its new id (renamed into place, then recorded: a crash in between
        leaves a file no row names, never a row without its file)."""
        assert upload.path is not None
        file_id = new_id("file-")
        path = self.files_dir / file_id
        os.replace(upload.path, path)
        upload.path = None
        _sync_folder(self.files_dir)
        record = FileRecord(file_id, upload.filename, purpose, upload.size, now(), str(path.relative_to(self.data_dir)))
        self.store.add_file(record)
        return record

    def file(self, file_id: str) -> FileRecord:
        record = self.store.file(file_id)
        if record is None:
            raise ApiError(404, f"No such file: {json.dumps(file_id)}.", NOT_FOUND, "file_id", "file_not_found")
        return record

    def path_of(self, record: FileRecord) -> Path:
        return self.data_dir / record.path

    def files(self, purpose: str | None, after: str | None, limit: int, newest_first: bool) -> Page:
        if after is not None:
            self.file(after)
        return self.store.files(purpose, after, limit, newest_first)

    def delete_file(self, file_id: str) -> FileRecord:
        record = self.file(file_id)
        users = self.store.batches_using_file(file_id, ACTIVE)
        if users:
            raise ApiError(409, f"The file is the input of batch {users[0]}, which has not ended; cancel it first.",
                           param="file_id", code="file_in_use")
        self.store.delete_file(file_id)
        self.path_of(record).unlink(missing_ok=True)
        return record

    # --- batches ----------------------------------------------------------------------------

    def create_batch(self, input_file_id: str, endpoint: str, metadata: dict[str, str] | None) -> BatchRecord:
        """A new batch, validating; its input is checked in the background."""
        source = self.file(input_file_id)
        if source.purpose != BATCH_PURPOSE:
            raise ApiError(400, f"The file {input_file_id} was uploaded with purpose {json.dumps(source.purpose)}; "
                                f"a batch's input needs purpose \"batch\".", param="input_file_id")
        created = now()
        record = BatchRecord(
            id=new_id("batch_"), endpoint=endpoint, input_file_id=input_file_id, completion_window=COMPLETION_WINDOW,
            metadata=metadata, model=self.rules.model_name, status="validating", errors=None, output_file_id=None,
            error_file_id=None, total=0, completed=0, failed=0, created_at=created, in_progress_at=None,
            finalizing_at=None, completed_at=None, failed_at=None, cancelling_at=None, cancelled_at=None,
            expires_at=created + COMPLETION_WINDOW_SECONDS)
        self.store.add_batch(record)
        self._start_validation(record.id)
        return record

    def batch(self, batch_id: str) -> BatchRecord:
        record = self.store.batch(batch_id)
        if record is None:
            raise ApiError(404, f"No such batch: {json.dumps(batch_id)}.", NOT_FOUND, "batch_id", "batch_not_found")
        return record

    def batches(self, after: str | None, limit: int) -> Page:
        if after is not None:
            self.batch(after)
        return self.store.batches(after, limit)

    def cancel_batch(self, batch_id: str) -> BatchRecord:
        """Cancel a batch: one still validating ends at once; a running one stops its requests
        (the lines already written stay) and ends cancelled; one waiting its turn ends at once."""
        self.batch(batch_id)
        at = now()
        if self.store.move_batch(batch_id, ["validating"], "cancelled", at, cancelling_at=at):
            return self.batch(batch_id)
        if self.store.move_batch(batch_id, ["in_progress"], "cancelling", at):
            self._stop_or_finish(batch_id)
            return self.batch(batch_id)
        batch = self.batch(batch_id)
        if batch.status not in ("cancelling", "cancelled"):
            raise ApiError(409, f"The batch is {batch.status}: only a batch that is validating or in progress can be "
                                f"cancelled.", param="batch_id", code="batch_not_cancellable")
        return batch

    def _stop_or_finish(self, batch_id: str) -> None:
        """A batch now cancelling: the running one is interrupted (the worker ends it once its
        requests have ended); any other is ended here, since nothing writes its files (the
        worker runs only a batch still in progress)."""
        with self._lock:
            if self._current_batch == batch_id:
                self._current.interrupt()
                return
        self._finish(self.batch(batch_id), "cancelled")

    # --- validation -------------------------------------------------------------------------

    def _start_validation(self, batch_id: str) -> None:
        with self._lock:
            if batch_id in self._validating or self._stopping.is_set():
                return
            self._validating.add(batch_id)
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            thread = threading.Thread(target=self._validate, args=(batch_id,), name="multiseq-batch-check", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _validate(self, batch_id: str) -> None:
        try:
            batch = self.store.batch(batch_id)
            errors, total = self._input_errors(batch)
            if errors:
                self.store.move_batch(batch_id, ["validating"], "failed", now(), errors=errors)
            else:
                self.store.move_batch(batch_id, ["validating"], "in_progress", now(), total=total)
                self._wake.set()
        except Exception:  # noqa: BLE001 - the batch fails; the details go to the log, not the client
            logger.exception("validating batch %s failed", batch_id)
            self.store.move_batch(batch_id, ["validating"], "failed", now(),
                                  errors=[_batch_error("server_error", INTERNAL_ERROR_MESSAGE)])
        finally:
            with self._lock:
                self._validating.discard(batch_id)

    def _input_errors(self, batch: BatchRecord) -> tuple[list[dict[str, Any]], int]:
        """What makes the input file unfit as a whole (a bad line is that line's error, not
        the file's), and how many requests it holds."""
        source = self.store.file(batch.input_file_id)
        if source is None or not self.path_of(source).exists():
            return [_batch_error("file_not_found", "The input file was deleted.", "input_file_id")], 0
        path = self.path_of(source)
        try:
            sniff_text(path)
        except NotTextError:
            return [_batch_error("invalid_file_format", "The input file is not UTF-8 text with one JSON request a "
                                                        "line.", "input_file_id")], 0
        total = count_items(path)
        if total == 0:
            return [_batch_error("empty_file", "The input file holds no requests.", "input_file_id")], 0
        if total > self.rules.max_lines:
            return [_batch_error("too_many_requests", f"The input file holds {total} requests; this server takes "
                                                      f"at most {self.rules.max_lines} in one batch.",
                                 "input_file_id")], total
        scan = scan_file(path, PromptFormat.OPENAI, False, self.rules.defaults, TextMode.CHAT)
        if scan.duplicates:
            return [_batch_error("duplicate_custom_id", f"custom_id {duplicate} is given more than once; each "
                                                        f"request needs its own.", "custom_id")
                    for duplicate in scan.duplicates], total
        return [], total

    # --- the worker -------------------------------------------------------------------------

    def start(self, runner: Runner) -> None:
        """Run batches on `runner` from now on: the ones a previous run left unfinished first
        (validations cut short are done again)."""
        with self._lock:
            if self._worker is not None or self._stopping.is_set():
                return
            self._runner = runner
            self._worker = threading.Thread(target=self._work, name="multiseq-batches", daemon=True)
        for batch in self.store.batches_with_status(["validating"]):
            self._start_validation(batch.id)
        self._worker.start()

    def stop(self) -> None:
        """Stop taking batch work: the running batch's requests are cancelled and get no line
        (it resumes at the next start). Returns at once; close() waits."""
        with self._lock:
            self._stopping.set()
            if self._current is not None:
                self._current.interrupt()
        self._wake.set()

    def close(self) -> None:
        """Stop, wait for the worker and the validations, and close the database."""
        self.stop()
        with self._lock:
            threads = [*self._threads, *([self._worker] if self._worker is not None else [])]
        for thread in threads:
            if thread.is_alive():
                thread.join()
        self.store.close()

    def num_waiting_lines(self, runner: Runner) -> int:
        """The running batch's requests that wait for a slot (they are not to count against
        --max-queue, which is for interactive requests)."""
        run = self._current
        if run is None:
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
            self._finish(self.batch(batch_id), "failed", [_batch_error("server_error", INTERNAL_ERROR_MESSAGE)])
        except Exception:  # noqa: BLE001 - the database or the disk itself fails: leave it for the next start
            logger.exception("batch %s could not be ended as failed", batch_id)
            self._stopping.wait(1.0)  # and do not spin on it

    def _advance(self, batch: BatchRecord) -> None:
        if batch.status == "in_progress":
            self._run(batch)
            if self._stopping.is_set():
                return  # in_progress still: the next start resumes it
            self.store.move_batch(batch.id, ["in_progress"], "finalizing", now())
            batch = self.batch(batch.id)
        if batch.status == "finalizing":
            self._finish(batch, "completed")
        elif batch.status == "cancelling":
            self._finish(batch, "cancelled")

    def _run(self, batch: BatchRecord) -> None:
        """Run the lines of the batch that have no output line yet."""
        output_path, errors_path = self._result_paths(batch.id)
        output_path.parent.mkdir(exist_ok=True)
        for path in (output_path, errors_path):
            if drop_torn_tail(path):
                logger.info("batch %s: cut a line torn by a crash from %s", batch.id, path.name)
        succeeded, num_succeeded = written_ids(output_path)
        failed, num_failed = written_ids(errors_path)
        self.store.set_counts(batch.id, num_succeeded, num_failed)
        items = self._items_to_run(batch, lambda item_id: item_id in succeeded or item_id in failed)
        output = ResultSink.open_file(output_path, durable=True)
        errors = ResultSink.open_file(errors_path, durable=True)
        try:
            writer = ResultWriter(output, keep_input_order=False, errors_sink=errors)
            run = ApiBatchRun(self._runner, items, max(0, batch.total - num_succeeded - num_failed), writer,
                              self.rules.model_name, LINES_PER_SLOT * self._runner.config.parallel, f"{batch.id}/")
            with self._lock:
                if self._stopping.is_set() or self.batch(batch.id).status != "in_progress":
                    return  # stopped, or cancelled before it started
                self._current, self._current_batch = run, batch.id
            run.execute(_Progress(self.store, batch.id, output, errors, num_succeeded, num_failed))
        finally:
            with self._lock:
                self._current = self._current_batch = None
            output.close()
            errors.close()

    def _items_to_run(self, batch: BatchRecord, is_done) -> Iterator[PromptItem]:
        """The batch's lines whose custom_id has no output line yet, as items (read lazily)."""
        source = self.store.file(batch.input_file_id)
        is_chat = batch.endpoint == CHAT_URL
        for line in iter_lines(self.path_of(source)):
            item_id = line_id(line, PromptFormat.OPENAI)
            if item_id is not None and not is_done(item_id):
                yield self._line_item(line, is_chat, batch.endpoint)

    def _line_item(self, line: RawLine, is_chat: bool, endpoint: str) -> PromptItem:
        """A line as batch-run reads it, then held to the batch: its url must be the batch's
        endpoint and its model this server's; it runs as batch work, with the server's rules."""
        item = parse_line(line, PromptFormat.OPENAI, self.rules.defaults)
        if not item.is_valid:
            return item
        misfit = self._misfit(line, item, is_chat, endpoint)
        if misfit is not None:
            message, param = misfit
            return dataclasses.replace(item, request=None, error=f"line {line.number}: {message}", error_param=param)
        request = dataclasses.replace(item.request, overflow=self.rules.overflow, priority=Priority.BATCH)
        return dataclasses.replace(item, request=request)

    def _misfit(self, line: RawLine, item: PromptItem, is_chat: bool, endpoint: str) -> tuple[str, str] | None:
        if item.is_chat != is_chat:
            return f"url must be {endpoint}, the batch's endpoint", "url"
        model = json.loads(decode_line(line))["body"].get("model")  # a valid line: a JSON object with a body
        if model is not None and model != self.rules.model_name:
            return (f"the model {json.dumps(model)} does not exist: this server serves "
                    f"{json.dumps(self.rules.model_name)}", "model")
        return None

    def _finish(self, batch: BatchRecord, status: str, errors: list[dict[str, Any]] | None = None) -> None:
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
                                    now(), str(path.relative_to(self.data_dir)))
                outputs.append(record)
                changes[f"{kind}_file_id"] = record.id
        if errors is not None:
            changes["errors"] = errors
        self.store.finish_batch(batch.id, batch.status, status, now(), outputs, completed=counts["output"],
                                failed=counts["error"], **changes)

    def _result_paths(self, batch_id: str) -> tuple[Path, Path]:
        folder = self.batches_dir / batch_id
        return folder / OUTPUT_NAME, folder / ERRORS_NAME


def _batch_error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _sync_folder(folder: Path) -> None:
    """A rename in the folder on disk (the folder's own entry), as the file's bytes are."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
