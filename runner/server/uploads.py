"""A multipart/form-data upload (POST /v1/files) streamed to disk as it arrives.

The file part's bytes go straight to a file in the upload folder, chunk by chunk, counted
against the limit: nothing holds the upload whole, and one over the limit is refused (413) as
soon as its bytes pass it. The other parts (purpose, ...) are short text, bounded too.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import python_multipart
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header
from starlette.requests import Request as HttpRequest

from .errors import ApiError

FILE_FIELD = "file"
MAX_FIELD_BYTES = 1024  # a text part: purpose is a word
MAX_PARTS = 8
# What a form adds around the file's bytes (boundaries, part headers, the other fields).
FORM_OVERHEAD_BYTES = 64 * 1024
UPLOAD_PREFIX = ".upload-"  # a file still arriving (left by a crash: removed at the next start)


@dataclass
class Upload:
    """The form: its text fields, and the file part on disk under a temporary name."""

    fields: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    filename: str = ""
    size: int = 0

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The file is larger than this server's upload limit of {limit} bytes.",
                    param=FILE_FIELD, code="file_too_large")


class _FormReader:
    """python-multipart's callbacks: part headers decide where a part's bytes go (the file
    part to disk, a text part to a small buffer)."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.upload = Upload()
        self._folder = folder
        self._limit = limit
        self._num_parts = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""
        self._name = ""
        self._text = bytearray()
        self.file: BinaryIO | None = None  # the file part's file, open until the form ends
        self._in_file_part = False

    def callbacks(self) -> dict:
        return {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value_part, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end}

    def _part_begin(self) -> None:
        self._num_parts += 1
        if self._num_parts > MAX_PARTS:
            raise ApiError(400, f"The form has more than {MAX_PARTS} parts.")
        self._disposition, self._name, self._text, self._in_file_part = b"", "", bytearray(), False

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_part(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if not self._name:
            raise ApiError(400, "Each part of the form needs a name (Content-Disposition: form-data; name=...).")
        if self._name == FILE_FIELD:
            if self.file is not None:
                raise ApiError(400, "The form has more than one 'file' part.", param=FILE_FIELD)
            self.upload.filename = options.get(b"filename", b"upload.jsonl").decode("utf-8", "replace")
            self.file = tempfile.NamedTemporaryFile(dir=self._folder, prefix=UPLOAD_PREFIX, delete=False)
            self.upload.path = Path(self.file.name)
            self._in_file_part = True

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if not self._in_file_part:
            if len(self._text) + end - start > MAX_FIELD_BYTES:
                raise ApiError(400, f"The form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes.",
                               param=self._name)
            self._text += data[start:end]
            return
        self.upload.size += end - start
        if self.upload.size > self._limit:
            raise too_large(self._limit)
        # A page-cache write of one network chunk: short enough for the event loop.
        self.file.write(data[start:end])

    def _part_end(self) -> None:
        if not self._in_file_part:
            self.upload.fields[self._name] = self._text.decode("utf-8", "replace")
        self._in_file_part = False


async def receive_upload(request: HttpRequest, folder: Path, limit: int) -> Upload:
    """Read a multipart/form-data body: the file part goes to a new file in `folder` (fsynced
    before this returns). ApiError for a body that is not such a form, or a file over `limit`
    bytes; nothing is left on disk then."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or not options.get(b"boundary"):
        raise ApiError(400, "Upload a file as multipart/form-data, with a 'file' part and a 'purpose' field.")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + FORM_OVERHEAD_BYTES:
        raise too_large(limit)
    reader = _FormReader(folder, limit)
    parser = python_multipart.MultipartParser(options[b"boundary"], reader.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
        if reader.file is None:
            raise ApiError(400, "The form has no 'file' part.", param=FILE_FIELD)
        await request.app.state.server.offload.io(_sync, reader.file)
        return reader.upload
    except FormParserError:
        reader.upload.discard()
        raise ApiError(400, "The body is not a valid multipart/form-data form.") from None
    except BaseException:
        reader.upload.discard()
        raise
    finally:
        if reader.file is not None:
            reader.file.close()


def _sync(handle: BinaryIO) -> None:
    """The upload's bytes on disk before its id is given out."""
    handle.flush()
    os.fsync(handle.fileno())
