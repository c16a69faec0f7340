"""The Files and Batch APIs' work: files kept on disk, batches validated, run below interactive
requests, and resumed after a restart.

A batch goes validating -> in_progress -> finalizing -> completed (failed when its input is
not a batch file; cancelling -> cancelled when asked). BatchService ties together the parts,
each in its own module: the files (filestore.FileStore), the check of a new batch's input
(validation.BatchValidator) and the thread that runs the batches and ends them
(worker.BatchWorker, where exactly-once across crashes is explained).

Data directory layout: multiseq.db, files/<file id> (uploads), batches/<batch id>/output.jsonl
and errors.jsonl (published as files when the batch ends).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..formats.reader import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL
from ..loop.runner import Runner
from .batchrules import BatchRules, new_id, now
from .errors import NOT_FOUND, ApiError
from .filestore import FileStore
from .store import BatchRecord, FileRecord, Page, Store, StoreError
from .uploads import Upload
from .validation import BatchValidator
from .worker import LINES_PER_SLOT, OUTPUT_PURPOSE, BatchWorker

__all__ = ["ACTIVE", "BATCH_PURPOSE", "COMPLETION_WINDOW", "ENDPOINTS", "LINES_PER_SLOT", "OUTPUT_PURPOSE",
           "BatchRules", "BatchService"]

ENDPOINTS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)
COMPLETION_WINDOW = "24h"  # the only one OpenAI offers; here a batch runs to its end whatever it says
COMPLETION_WINDOW_SECONDS = 24 * 3600
BATCH_PURPOSE = "batch"
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


class BatchService:
    """Files and batches in one data directory, and the thread that runs the batches."""

    def __init__(self, data_dir: Path, rules: BatchRules) -> None:
        self.data_dir = data_dir
        self.store = Store.open(data_dir)  # StoreError when the folder cannot be used
        try:
            self._files = FileStore(data_dir, self.store)
            self._worker = BatchWorker(self.store, self._files, rules)
        except (OSError, StoreError) as error:
            self.store.close()
            if isinstance(error, StoreError):
                raise
            raise StoreError(f"cannot use the data directory {data_dir}: {error}") from None
        self.rules = rules
        self._validator = BatchValidator(self.store, self._files, rules, on_valid=self._worker.wake)

    # --- files ------------------------------------------------------------------------------

    @property
    def files_dir(self) -> Path:
        return self._files.files_dir

    def add_upload(self, upload: Upload, purpose: str) -> FileRecord:
        return self._files.add_upload(upload, purpose)

    def file(self, file_id: str) -> FileRecord:
        return self._files.file(file_id)

    def path_of(self, record: FileRecord) -> Path:
        return self._files.path_of(record)

    def files(self, purpose: str | None, after: str | None, limit: int, newest_first: bool) -> Page:
        return self._files.files(purpose, after, limit, newest_first)

    def delete_file(self, file_id: str) -> FileRecord:
        """Delete a file no batch still needs as its input (409 while one does)."""
        record = self.file(file_id)
        users = self.store.batches_using_file(file_id, ACTIVE)
        if users:
            raise ApiError(409, f"The file is the input of batch {users[0]}, which has not ended; cancel it first.",
                           param="file_id", code="file_in_use")
        self._files.delete(record)
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
        self._validator.start(record.id)
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
            self._worker.stop_or_finish(batch_id)
            return self.batch(batch_id)
        batch = self.batch(batch_id)
        if batch.status not in ("cancelling", "cancelled"):
            raise ApiError(409, f"The batch is {batch.status}: only a batch that is validating or in progress can be "
                                f"cancelled.", param="batch_id", code="batch_not_cancellable")
        return batch

    # --- running ----------------------------------------------------------------------------

    def start(self, runner: Runner, runner_for: Callable[[str], Runner] | None = None) -> None:
        """Run batches from now on: on `runner`, or the runner of each batch's model
        (`runner_for`); the ones a previous run left unfinished first (validations cut short are
        done again)."""
        if not self._worker.start(runner_for or (lambda _: runner)):
            return
        for batch in self.store.batches_with_status(["validating"]):
            self._validator.start(batch.id)

    def stop(self) -> None:
        """Stop taking batch work: the running batch's requests are cancelled and get no line
        (it resumes at the next start). Returns at once; close() waits."""
        self._validator.stop()
        self._worker.stop()

    def close(self) -> None:
        """Stop, wait for the worker and the validations, and close the database."""
        self.stop()
        self._validator.close()
        self._worker.close()
        self.store.close()

    def num_waiting_lines(self, runner: Runner) -> int:
        """The running batch's requests that wait for a slot (not counted against --max-queue)."""
        return self._worker.num_waiting_lines(runner)
