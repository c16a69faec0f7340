"""Item ids of files of any size, kept as 8-byte hashes in sorted numpy arrays.

A prompts file may hold millions of lines; a Python set of their ids would cost ~100 bytes
each. An id is kept here as the 8-byte blake2b hash of its UTF-8 bytes instead: 8 bytes per id,
looked up by binary search. Two different ids share a hash with probability ~n²/2^65 (about
one in 10^6 for five million ids); where a match matters the caller checks the ids themselves
(duplicate_lines re-reads the file to name them).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable

import numpy as np

HASH_BYTES = 8


def id_hash(item_id: str) -> int:
    """The id's 8-byte hash as an unsigned integer (ids holding lone surrogates, which JSON
    escapes allow, hash too)."""
    data = item_id.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=HASH_BYTES).digest(), "little")


class HashCollector:
    """Appends id hashes at 8 bytes each (array('Q') grows in place, like a list of ints
    would not)."""

    def __init__(self) -> None:
        self._hashes = array("Q")

    def add(self, item_id: str) -> None:
        self._hashes.append(id_hash(item_id))

    def __len__(self) -> int:
        return len(self._hashes)

    def to_array(self) -> np.ndarray:
        """The hashes as a uint64 array, in the order they were added (this drops the buffer)."""
        hashes = np.array(self._hashes, dtype=np.uint64)
        self._hashes = array("Q")
        return hashes


def repeated_hashes(sorted_hashes: np.ndarray) -> np.ndarray:
    """The hashes that occur more than once in a sorted array, sorted."""
    hashes = sorted_hashes
    is_repeat = hashes[1:] == hashes[:-1]
    return np.unique(hashes[1:][is_repeat])


class IdSet:
    """A fixed set of ids (as hashes): membership by binary search, 8 bytes per id."""

    def __init__(self, hashes: np.ndarray | None = None) -> None:
        self._hashes = np.unique(hashes) if hashes is not None else np.empty(0, dtype=np.uint64)

    @classmethod
    def of(cls, item_ids: Iterable[str]) -> IdSet:
        return cls(np.fromiter((id_hash(item_id) for item_id in item_ids), dtype=np.uint64))

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, item_id: str) -> bool:
        return self.contains_hash(id_hash(item_id))

    def contains_hash(self, value: int) -> bool:
        index = int(np.searchsorted(self._hashes, np.uint64(value)))
        return index < len(self._hashes) and int(self._hashes[index]) == value

    def count_in(self, hashes: np.ndarray) -> int:
        """How many of `hashes` are in the set."""
        return int(np.isin(hashes, self._hashes, assume_unique=False).sum())

    @property
    def nbytes(self) -> int:
        return self._hashes.nbytes
