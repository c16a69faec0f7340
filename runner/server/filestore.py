"""The Files API's bytes: uploads renamed into the data directory's files/ folder and
recorded in the database, listed, read and deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .batchrules import new_id, now
from .errors import NOT_FOUND, ApiError
from .store import FileRecord, Page, Store, StoreError
from .uploads import UPLOAD_PREFIX, Upload


class FileStore:
    """The files of one data directory: their bytes under files/, their rows in `store`."""

    def __init__(self, data_dir: Path, store: Store) -> None:
        self.data_dir = data_dir
        self.store = store
        self.files_dir = data_dir / "files"
        try:
            self.files_dir.mkdir(exist_ok=True)
            for leftover in self.files_dir.glob(f"{UPLOAD_PREFIX}*"):  # an upload a crash cut short
                leftover.unlink(missing_ok=True)
        except OSError as error:
            raise StoreError(f"cannot use the data directory {data_dir}: {error}") from None

    def add_upload(self, upload: Upload, purpose: str) -> FileRecord:
        """The upload under its new id (renamed into place, then recorded: a crash in between
        leaves a file no row names, never a row without its file)."""
        assert upload.path is not None
        file_id = new_id("file-")
        path = self.files_dir / file_id
        os.replace(upload.path, path)
        upload.path = None
        sync_folder(self.files_dir)
        record = FileRecord(file_id, upload.filename, purpose, upload.size, now(), str(path.relative_to(self.data_dir)))
        self.store.add_file(record)
        return record

    def file(self, file_id: str) -> FileRecord:
        """The file's record; a 404 ApiError when there is none."""
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

    def delete(self, record: FileRecord) -> None:
        """Forget the file, then remove its bytes (a crash in between leaves bytes no row names)."""
        self.store.delete_file(record.id)
        self.path_of(record).unlink(missing_ok=True)


def sync_folder(folder: Path) -> None:
    """A rename in the folder on disk (the folder's own entry), as the file's bytes are."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
