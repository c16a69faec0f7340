"""Stored responses of the Responses API: what `store` keeps and `previous_response_id` reads.

A stored response keeps its own input items and its Response object (whose `output` holds its
output items) and the id of the response it continued, so a conversation is the chain of its
responses. With a data directory they are rows of a SQLite database beside the Batch API's
(its own file, so neither schema constrains the other); without one, the most recently used
responses are kept in memory, a bounded number of them, and are gone when the server stops.
Every method blocks (SQLite, a lock): call them from a worker thread, never the event loop.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .store import StoreError

DATABASE_NAME = "responses.db"
DEFAULT_MEMORY_CAPACITY = 1_000  # responses kept without a data directory, least recently used dropped first
BUSY_TIMEOUT_MS = 5_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    previous_response_id TEXT,               -- the response this one continued, or NULL
    input_items TEXT NOT NULL,               -- JSON list: this response's own input items
    response TEXT NOT NULL                   -- JSON: the Response object, its output items within
);
"""


@dataclass(frozen=True)
class StoredResponse:
    id: str
    created_at: int
    previous_response_id: str | None
    input_items: list[dict[str, Any]]
    response: dict[str, Any]

    @property
    def output_items(self) -> list[dict[str, Any]]:
        return self.response["output"]


class MissingResponse(LookupError):
    """A response that is not stored (never was, was deleted, or fell out of memory)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id


class ResponseStore(ABC):
    """Where stored responses live. Blocking: call from a worker thread."""

    @abstractmethod
    def put(self, record: StoredResponse) -> None: ...

    @abstractmethod
    def get(self, response_id: str) -> StoredResponse | None: ...

    @abstractmethod
    def delete(self, response_id: str) -> bool:
        """Whether there was such a response."""

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """The items of the conversation the response ends, oldest first: for it and each
        response it continued (recursively), its input items then its output items.
        MissingResponse names the first response of the chain that is not stored."""
        chain: list[StoredResponse] = []
        current: str | None = response_id
        seen: set[str] = set()
        while current is not None and current not in seen:  # ids only point back in time; `seen` is a guard
            record = self.get(current)
            if record is None:
                raise MissingResponse(current)
            seen.add(current)
            chain.append(record)
            current = record.previous_response_id
        return [item for record in reversed(chain) for item in (*record.input_items, *record.output_items)]


class MemoryResponseStore(ResponseStore):
    """The last `capacity` responses stored or read, in memory."""

    def __init__(self, capacity: int = DEFAULT_MEMORY_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, record: StoredResponse) -> None:
        with self._lock:
            self._records[record.id] = record
            self._records.move_to_end(record.id)
            while len(self._records) > self.capacity:
                self._records.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            record = self._records.get(response_id)
            if record is not None:
                self._records.move_to_end(response_id)
            return record

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._records.pop(response_id, None) is not None


class SqliteResponseStore(ResponseStore):
    """Responses in `responses.db` in the data directory. A connection per call: calls come
    from whichever worker thread runs them, and there is nothing to close at shutdown."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / DATABASE_NAME
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as connection:
                # WAL: readers never wait for a writer; a committed response survives a crash.
                if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
                    raise StoreError(f"{data_dir} does not support SQLite's WAL mode (a network file system?)")
                connection.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as error:
            raise StoreError(f"cannot keep responses in the data directory {data_dir}: {error}") from None

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None)
        connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        return connection

    def put(self, record: StoredResponse) -> None:
        with closing(self._connect()) as connection:
            connection.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, previous_response_id, input_items, response) "
                "VALUES (?, ?, ?, ?, ?)",
                (record.id, record.created_at, record.previous_response_id,
                 json.dumps(record.input_items, ensure_ascii=False), json.dumps(record.response, ensure_ascii=False)))

    def get(self, response_id: str) -> StoredResponse | None:
        with closing(self._connect()) as connection:
            row = connection.execute("SELECT id, created_at, previous_response_id, input_items, response "
                                     "FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return None
        return StoredResponse(row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4]))

    def delete(self, response_id: str) -> bool:
        with closing(self._connect()) as connection:
            return connection.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount == 1


def open_response_store(data_dir: Path | None, capacity: int = DEFAULT_MEMORY_CAPACITY) -> ResponseStore:
    """The data directory's store, or an in-memory one without a data directory. StoreError
    when the directory cannot be used."""
    return MemoryResponseStore(capacity) if data_dir is None else SqliteResponseStore(data_dir)
