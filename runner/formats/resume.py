"""--resume: what an earlier run's output file says is done, and that file made ready to append.

Only successful lines (stop or length) count as done; the file is rewritten with only those
(atomically), so failed, cancelled, torn and duplicate lines go and their ids run again: after
the resumed run, each id is in the file once. Neither pass holds the file's lines; the ids
done are kept as 8-byte hashes (ids.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .ids import HashCollector, IdSet


def record_id(record: dict[str, Any]) -> str | None:
    """The id of a result line (None for a line that names none)."""
    value = record.get("custom_id") if "custom_id" in record else record.get("id")
    return None if value is None else str(value)


_SUCCESS = ("stop", "length")


def record_succeeded(record: dict[str, Any]) -> bool:
    """A result line that finished successfully: every choice ended by stop or length. A 400 or
    500 response, an error, a cancelled or missing choice, or a shape we never write is not a
    success (--resume runs it again)."""
    if "custom_id" in record:
        response = record.get("response")
        if not isinstance(response, dict) or response.get("status_code") != 200:
            return False
        body = response.get("body")
        if isinstance(body, dict) and body.get("object") == "list":  # an embeddings line's vectors
            return isinstance(body.get("data"), list)
        return _all_succeeded(body.get("choices") if isinstance(body, dict) else None)
    if "choices" in record:
        return record.get("error") is None and _all_succeeded(record["choices"])
    return choice_succeeded(record)


def _all_succeeded(choices: Any) -> bool:
    return isinstance(choices, list) and bool(choices) and all(
        isinstance(choice, dict) and choice.get("finish_reason") in _SUCCESS for choice in choices)


def choice_succeeded(record: dict[str, Any]) -> bool:
    """One result object (a line, or one choice of it) that ended by stop or length."""
    return record.get("error") is None and record.get("finish_reason") in _SUCCESS


def keep_succeeded_lines(path: Path) -> IdSet:
    """For --resume: rewrite the output file with only its successful lines (atomically, so a
    crash leaves the old file) and return their ids. Failed, cancelled and torn lines go, so
    their ids run again and each id ends up in the file once. Two passes over the file, never
    holding its lines: 8 bytes per kept line for the ids, 8 for their line numbers."""
    if not path.exists():
        return IdSet()
    kept_hashes, kept_lines = HashCollector(), array("Q")
    for index, data in enumerate(_binary_lines(path)):
        item_id = _succeeded_id(data)
        if item_id is not None:
            kept_hashes.add(item_id)
            kept_lines.append(index)
    hashes = kept_hashes.to_array()
    _, first = np.unique(hashes, return_index=True)  # a repeated id keeps its first line
    keep = np.sort(np.asarray(kept_lines, dtype=np.uint64)[first])
    _rewrite_keeping(path, keep)
    return IdSet(hashes)


def _binary_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        yield from handle


def _succeeded_id(data: bytes) -> str | None:
    """The id of a successful result line; None for any other line, including one torn by a
    killed run or one that is not UTF-8."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not record_succeeded(record):
        return None
    return record_id(record)


def _rewrite_keeping(path: Path, keep: np.ndarray) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".resume")
    try:
        with os.fdopen(descriptor, "wb") as out:
            position = 0
            for index, data in enumerate(_binary_lines(path)):
                if position < len(keep) and keep[position] == index:
                    out.write(data if data.endswith(b"\n") else data + b"\n")
                    position += 1
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# --- an output appended to across restarts (the server's Batch API) ---------------------------

_TAIL_BLOCK = 1 << 16


def drop_torn_tail(path: Path) -> int:
    """Cut the file back to its last whole line: a process killed while appending may have left
    part of a line, which would otherwise run into the next one written. Returns how many
    bytes were cut (0: the file ends with a newline, is empty, or does not exist)."""
    if not path.exists():
        return 0
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        keep = _end_of_last_line(handle, size)
        if keep == size:
            return 0
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return size - keep


def _end_of_last_line(handle, size: int) -> int:
    """The offset just past the file's last newline (0 when it has none), read from the end."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        handle.seek(start)
        block = handle.read(end - start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def written_ids(path: Path) -> tuple[IdSet, int]:
    """The ids of the lines of an output file (whole lines, as drop_torn_tail leaves them),
    whatever their outcome, and how many lines it has: a line written is done, failed or not.
    Holds 8 bytes per line."""
    if not path.exists():
        return IdSet(), 0
    collector, num_lines = HashCollector(), 0
    for data in _binary_lines(path):
        num_lines += 1
        item_id = _line_record_id(data)
        if item_id is not None:
            collector.add(item_id)
    return IdSet(collector.to_array()), num_lines


def _line_record_id(data: bytes) -> str | None:
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return record_id(record) if isinstance(record, dict) else None
