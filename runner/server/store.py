"""What the Files and Batch APIs keep across restarts: file and batch metadata in SQLite.

One database file in the data directory (WAL mode, synchronous=FULL: a transaction that
returned is on disk, and readers never wait for the writer). The bytes of files are not in
it: uploads and batch results are plain files beside it, named by the rows. Every change is
one short transaction under one lock, so the event loop and the batch worker share a single
connection safely; a status changes only from the statuses a caller names (compare and set),
so a cancel and the worker can never both move a batch.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DATABASE_NAME = "multiseq.db"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- the order of creation, for listing
    id TEXT NOT NULL UNIQUE,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    path TEXT NOT NULL                       -- the bytes, relative to the data directory
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    metadata TEXT,                           -- JSON object, or NULL
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    errors TEXT,                             -- JSON list of {code, message, param, line}, or NULL
    output_file_id TEXT,
    error_file_id TEXT,
    total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER,
    expires_at INTEGER
);
"""


class StoreError(Exception):
    """The data directory or its database cannot be used (a message for a person)."""


@dataclass(frozen=True)
class FileRecord:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    path: str  # relative to the data directory


@dataclass(frozen=True)
class BatchRecord:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    model: str
    status: str
    errors: list[dict[str, Any]] | None
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int
    created_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    expires_at: int | None


_FILE_COLUMNS = [field.name for field in fields(FileRecord)]
_BATCH_COLUMNS = [field.name for field in fields(BatchRecord)]
_JSON_COLUMNS = ("metadata", "errors")
# The timestamps a status change may set, named after the status (OpenAI's fields).
_STATUS_TIMES = {"in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled"}


@dataclass(frozen=True)
class Page:
    """One page of a listing, newest first unless asked otherwise."""

    records: list
    has_more: bool


class Store:
    """The database of one data directory."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()

    @classmethod
    def open(cls, data_dir: Path) -> Store:
        """Open (creating when needed) the data directory's database."""
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(data_dir / DATABASE_NAME, isolation_level=None, check_same_thread=False)
            connection.row_factory = sqlite3.Row
            # WAL: readers (GET /v1/batches) do not wait for the worker's writes. FULL: a
            # commit that returned survives a power cut, like the fsynced output lines.
            if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
                raise StoreError(f"{data_dir} does not support SQLite's WAL mode (a network file system?)")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA busy_timeout=5000")
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{data_dir / DATABASE_NAME} was written by a newer multiseq (schema {version})")
            connection.executescript(_SCHEMA)
            connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (OSError, sqlite3.Error) as error:
            raise StoreError(f"cannot use the data directory {data_dir}: {error}") from None
        return cls(connection)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, sql: str, values: Iterable[Any] = ()) -> list[sqlite3.Row]:
        """The rows of a query, fetched under the lock (the connection is shared)."""
        with self._lock:
            return self._db.execute(sql, tuple(values)).fetchall()

    def _change(self, sql: str, values: Iterable[Any] = ()) -> int:
        """Run one statement (its own transaction); how many rows it changed."""
        with self._lock:
            return self._db.execute(sql, tuple(values)).rowcount

    # --- files ----------------------------------------------------------------------------------

    def add_file(self, record: FileRecord) -> None:
        self._change(f"INSERT INTO files ({', '.join(_FILE_COLUMNS)}) VALUES ({', '.join('?' * len(_FILE_COLUMNS))})",
                      [getattr(record, name) for name in _FILE_COLUMNS])

    def file(self, file_id: str) -> FileRecord | None:
        rows = self._rows("SELECT * FROM files WHERE id = ?", [file_id])
        return _file_of(rows[0]) if rows else None

    def files(self, purpose: str | None, after: str | None, limit: int, newest_first: bool) -> Page:
        where, values = [], []
        if purpose is not None:
            where.append("purpose = ?")
            values.append(purpose)
        if after is not None:
            where.append(f"seq {'<' if newest_first else '>'} (SELECT seq FROM files WHERE id = ?)")
            values.append(after)
        rows = self._page("files", where, values, limit, newest_first)
        return Page([_file_of(row) for row in rows[:limit]], len(rows) > limit)

    def delete_file(self, file_id: str) -> None:
        self._change("DELETE FROM files WHERE id = ?", [file_id])

    def _page(self, table: str, where: list[str], values: list[Any], limit: int, newest_first: bool) -> list:
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        order = "DESC" if newest_first else "ASC"
        return self._rows(f"SELECT * FROM {table} {clause} ORDER BY seq {order} LIMIT ?", [*values, limit + 1])

    # --- batches --------------------------------------------------------------------------------

    def add_batch(self, record: BatchRecord) -> None:
        values = [_column_value(name, getattr(record, name)) for name in _BATCH_COLUMNS]
        self._change(f"INSERT INTO batches ({', '.join(_BATCH_COLUMNS)}) "
                      f"VALUES ({', '.join('?' * len(_BATCH_COLUMNS))})", values)

    def batch(self, batch_id: str) -> BatchRecord | None:
        rows = self._rows("SELECT * FROM batches WHERE id = ?", [batch_id])
        return _batch_of(rows[0]) if rows else None

    def batches(self, after: str | None, limit: int) -> Page:
        where, values = [], []
        if after is not None:
            where.append("seq < (SELECT seq FROM batches WHERE id = ?)")
            values.append(after)
        rows = self._page("batches", where, values, limit, newest_first=True)
        return Page([_batch_of(row) for row in rows[:limit]], len(rows) > limit)

    def batches_with_status(self, statuses: Iterable[str]) -> list[BatchRecord]:
        """Batches in any of `statuses`, oldest first (the order they run in)."""
        statuses = list(statuses)
        rows = self._rows(f"SELECT * FROM batches WHERE status IN ({', '.join('?' * len(statuses))}) ORDER BY seq",
                          statuses)
        return [_batch_of(row) for row in rows]

    def move_batch(self, batch_id: str, from_statuses: Iterable[str], status: str, at: int,
                   **changes: Any) -> bool:
        """Set the batch's status (and its `<status>_at` time, and any other columns) if its
        status is one of from_statuses; whether it was."""
        from_statuses = list(from_statuses)
        if status in _STATUS_TIMES:
            changes[f"{status}_at"] = at
        assignments = ", ".join(["status = ?", *(f"{name} = ?" for name in changes)])
        changed = self._change(
            f"UPDATE batches SET {assignments} WHERE id = ? AND status IN ({', '.join('?' * len(from_statuses))})",
            [status, *(_column_value(name, value) for name, value in changes.items()), batch_id, *from_statuses])
        return changed == 1

    def set_counts(self, batch_id: str, completed: int, failed: int) -> None:
        self._change("UPDATE batches SET completed = ?, failed = ? WHERE id = ?", [completed, failed, batch_id])

    def finish_batch(self, batch_id: str, from_status: str, status: str, at: int, outputs: list[FileRecord],
                     **changes: Any) -> bool:
        """In one transaction: the batch's result files become files of the Files API, and the
        batch moves to its last status naming them (a crash in between leaves neither)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT status FROM batches WHERE id = ?", [batch_id]).fetchone()
                if row is None or row["status"] != from_status:
                    self._db.execute("ROLLBACK")
                    return False
                for record in outputs:
                    self._db.execute(f"INSERT INTO files ({', '.join(_FILE_COLUMNS)}) "
                                     f"VALUES ({', '.join('?' * len(_FILE_COLUMNS))})",
                                     [getattr(record, name) for name in _FILE_COLUMNS])
                changes[f"{status}_at"] = at
                assignments = ", ".join(["status = ?", *(f"{name} = ?" for name in changes)])
                self._db.execute(f"UPDATE batches SET {assignments} WHERE id = ?",
                                 [status, *(_column_value(name, value) for name, value in changes.items()), batch_id])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return True

    def batches_using_file(self, file_id: str, statuses: Iterable[str]) -> list[str]:
        statuses = list(statuses)
        rows = self._rows(f"SELECT id FROM batches WHERE input_file_id = ? AND status IN "
                          f"({', '.join('?' * len(statuses))})", [file_id, *statuses])
        return [row["id"] for row in rows]


def _column_value(name: str, value: Any) -> Any:
    return json.dumps(value) if name in _JSON_COLUMNS and value is not None else value


def _file_of(row: sqlite3.Row) -> FileRecord:
    return FileRecord(**{name: row[name] for name in _FILE_COLUMNS})


def _batch_of(row: sqlite3.Row) -> BatchRecord:
    values = {name: row[name] for name in _BATCH_COLUMNS}
    for name in _JSON_COLUMNS:
        if values[name] is not None:
            values[name] = json.loads(values[name])
    return BatchRecord(**values)
