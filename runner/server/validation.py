"""A new batch's input checked in the background: validating -> in_progress, or failed with
the reasons. A batch cancelled while it is checked stays cancelled (the status moves only
from validating)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..formats.lines import LineDecodeError, NotTextError, count_items, decode_line, iter_lines, sniff_text
from ..formats.reader import PromptFormat, TextMode
from ..formats.scan import scan_file
from .batchrules import BatchRules, batch_error, now
from .errors import INTERNAL_ERROR_MESSAGE
from .filestore import FileStore
from .store import BatchRecord, Store

logger = logging.getLogger("multiseq.server")


class BatchValidator:
    """One thread per batch being checked; on_valid is called when a batch is ready to run."""

    def __init__(self, store: Store, files: FileStore, rules: BatchRules, on_valid: Callable[[], None]) -> None:
        self.store = store
        self.files = files
        self.rules = rules
        self._on_valid = on_valid
        self._lock = threading.Lock()  # guards _validating, _threads and stopping
        self._stopping = False
        self._validating: set[str] = set()
        self._threads: list[threading.Thread] = []

    def start(self, batch_id: str) -> None:
        """Check the batch's input in the background (once at a time; not after stop())."""
        with self._lock:
            if batch_id in self._validating or self._stopping:
                return
            self._validating.add(batch_id)
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            thread = threading.Thread(target=self._validate, args=(batch_id,), name="multiseq-batch-check", daemon=True)
            self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """Start no more checks (those running finish; close() waits for them)."""
        with self._lock:
            self._stopping = True

    def close(self) -> None:
        """Stop, and wait for the checks under way."""
        self.stop()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread.is_alive():
                thread.join()

    def _validate(self, batch_id: str) -> None:
        try:
            batch = self.store.batch(batch_id)
            errors, total = self._input_errors(batch)
            model = None if errors else self._model_of(self.files.path_of(self.store.file(batch.input_file_id)))
            if errors:
                self.store.move_batch(batch_id, ["validating"], "failed", now(), errors=errors)
            else:
                self.store.move_batch(batch_id, ["validating"], "in_progress", now(), total=total, model=model)
                self._on_valid()
        except Exception:  # noqa: BLE001 - the batch fails; the details go to the log, not the client
            logger.exception("validating batch %s failed", batch_id)
            self.store.move_batch(batch_id, ["validating"], "failed", now(),
                                  errors=[batch_error("server_error", INTERNAL_ERROR_MESSAGE)])
        finally:
            with self._lock:
                self._validating.discard(batch_id)

    def _model_of(self, path) -> str:
        """The model the batch runs on: the first served one its lines name (a line naming
        another is that line's error, when it runs), else the first model."""
        for line in iter_lines(path):
            try:
                body = json.loads(decode_line(line)).get("body")
            except (ValueError, AttributeError, LineDecodeError):
                continue  # that line's own error, when it runs
            named = body.get("model") if isinstance(body, dict) else None
            if isinstance(named, str) and (model := self.rules.model_named(named)) is not None:
                return model
        return self.rules.model_name

    def _input_errors(self, batch: BatchRecord) -> tuple[list[dict[str, Any]], int]:
        """What makes the input file unfit as a whole (a bad line is that line's error, not
        the file's), and how many requests it holds."""
        source = self.store.file(batch.input_file_id)
        if source is None or not self.files.path_of(source).exists():
            return [batch_error("file_not_found", "The input file was deleted.", "input_file_id")], 0
        path = self.files.path_of(source)
        try:
            sniff_text(path)
        except NotTextError:
            return [batch_error("invalid_file_format", "The input file is not UTF-8 text with one JSON request a "
                                                       "line.", "input_file_id")], 0
        total = count_items(path)
        if total == 0:
            return [batch_error("empty_file", "The input file holds no requests.", "input_file_id")], 0
        if total > self.rules.max_lines:
            return [batch_error("too_many_requests", f"The input file holds {total} requests; this server takes "
                                                     f"at most {self.rules.max_lines} in one batch.",
                                "input_file_id")], total
        scan = scan_file(path, PromptFormat.OPENAI, False, self.rules.defaults, TextMode.CHAT)
        if scan.duplicates:
            return [batch_error("duplicate_custom_id", f"custom_id {duplicate} is given more than once; each "
                                                       f"request needs its own.", "custom_id")
                    for duplicate in scan.duplicates], total
        return [], total
