"""The pass over a prompts file before anything runs: how many items, duplicate ids, bad lines.

It never holds the file's requests. What it keeps per line is an 8-byte id hash (see ids.py),
and only while it runs; bad-line messages are kept for the first MAX_LISTED lines, the rest
are counted. A text file without --resume or --strict needs no pass at all: its ids are line
numbers, so counting its non-blank lines is enough.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import SamplingParams
from .ids import HashCollector, IdSet, id_hash, repeated_hashes
from .lines import count_items, iter_lines
from .reader import PromptFormat, TextMode, line_id, parse_line

MAX_LISTED = 20  # bad lines named in a --strict error; the rest are counted
MAX_LISTED_DUPLICATES = 5
MAX_LISTED_LINES = 10  # line numbers shown per duplicate id


@dataclass
class FileScan:
    num_items: int  # non-blank lines
    num_done: int = 0  # items whose id --resume found finished
    num_bad: int = 0  # lines that cannot run (counted with --strict only)
    bad_lines: list[str] = field(default_factory=list)  # the first MAX_LISTED of them
    duplicates: list[str] = field(default_factory=list)  # "'x' (lines 1, 3)", the first few
    id_hashes: np.ndarray | None = None  # every item's id hash, kept when asked (for --resume)

    @property
    def num_to_run(self) -> int:
        return self.num_items - self.num_done

    def count_done(self, done: IdSet) -> None:
        """Note how many items are already done, and drop the id hashes."""
        assert self.id_hashes is not None, "scan_file(keep_id_hashes=True) first"
        self.num_done = done.count_in(self.id_hashes)
        self.id_hashes = None


def scan_file(path: Path, prompt_format: PromptFormat, strict: bool, defaults: SamplingParams, text_mode: TextMode,
              keep_id_hashes: bool = False, media_root: Path | None = None) -> FileScan:
    """Count the items; find duplicate ids (not in text files, whose ids are line numbers);
    with `strict`, parse every line and keep the first errors; with `keep_id_hashes`, keep
    each item's id hash (sorted) for count_done."""
    has_ids = prompt_format is not PromptFormat.TEXT
    if not (has_ids or keep_id_hashes or strict):
        return FileScan(num_items=count_items(path))
    collector = HashCollector()
    scan = FileScan(num_items=0)
    for line in iter_lines(path):
        item_id = _check_line(line, prompt_format, strict, defaults, text_mode, scan, media_root or path.parent)
        if item_id is not None:
            collector.add(item_id)
    scan.num_items = len(collector)
    hashes = collector.to_array()
    hashes.sort()
    if has_ids:
        repeated = repeated_hashes(hashes)
        if len(repeated):
            scan.duplicates = name_duplicates(path, prompt_format, repeated)
    scan.id_hashes = hashes if keep_id_hashes else None
    return scan


def _check_line(line, prompt_format: PromptFormat, strict: bool, defaults: SamplingParams, text_mode: TextMode,
                scan: FileScan, media_root: Path) -> str | None:
    """The line's id (None when blank); with `strict`, its error is noted in the scan."""
    if not strict:
        return line_id(line, prompt_format)
    item = parse_line(line, prompt_format, defaults, text_mode, media_root)
    if item is None:
        return None
    if not item.is_valid:
        scan.num_bad += 1
        if len(scan.bad_lines) < MAX_LISTED:
            scan.bad_lines.append(item.error)
    return item.id


def name_duplicates(path: Path, prompt_format: PromptFormat, repeated: np.ndarray) -> list[str]:
    """Read the file again to name the ids behind the repeated hashes, with their lines (the
    first few of each). A hash shared by different ids (a collision) is no duplicate."""
    suspects = IdSet(repeated)
    seen: dict[str, _Occurrences] = {}
    for line in iter_lines(path):
        item_id = line_id(line, prompt_format)
        if item_id is None or not suspects.contains_hash(id_hash(item_id)):
            continue
        if item_id in seen or len(seen) < 2 * MAX_LISTED_DUPLICATES:
            seen.setdefault(item_id, _Occurrences()).add(line.number)
    duplicates = [(item_id, found) for item_id, found in seen.items() if found.count > 1]
    return [found.describe(item_id) for item_id, found in duplicates[:MAX_LISTED_DUPLICATES]]


@dataclass
class _Occurrences:
    """The lines of one id: how many, and the first few numbers."""

    count: int = 0
    first_lines: list[int] = field(default_factory=list)

    def add(self, number: int) -> None:
        self.count += 1
        if len(self.first_lines) < MAX_LISTED_LINES:
            self.first_lines.append(number)

    def describe(self, item_id: str) -> str:
        more = f" and {self.count - len(self.first_lines)} more" if self.count > len(self.first_lines) else ""
        return f"{item_id!r} (lines {', '.join(map(str, self.first_lines))}{more})"
