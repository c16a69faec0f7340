"""The disk tier of the prefix cache: slot states kept in files that outlive the process.

A state the RAM tier evicts, and at close every prefix the slots and the RAM tier keep, is
written here instead of being dropped; after a restart a prompt that starts with a file's
tokens is restored from it instead of being prefilled. A state is valid only in a context of
the same model file, KV types and attention kernels: the folder's states live in a subfolder
named by those (`state_key`), and a file also says the key it was written under.

A file is written so that a crash or a full disk never leaves one that loads: the bytes go to a
temporary file, are synced, and the file is renamed into place (then the folder is synced). A
CRC-32 of its tokens and state is checked on every read; a file that fails it is removed and
counted, never restored. The folder is bounded in bytes (temporary files included: room is
reserved before a write starts), least recently used files going first; their use survives a
restart as their modification time.

Writes run on a thread of their own (a state is tens to hundreds of megabytes): the engine
hands a state over and goes on. Pure Python: the backend saves and restores states.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .prefix import common_prefix_length, starts_with

logger = logging.getLogger("multiseq.cache")

_MAGIC = b"MSKV\x01\r\n\x1a"  # a version byte, and bytes that a text transfer would change
# magic, the key's digest, the token count, the state's bytes, the CRC-32 of tokens and state
_HEADER = struct.Struct("<8s16sQQI")
_SUFFIX = ".kv"
_PARTIAL = ".partial"
_PENDING_WRITES = 4  # states queued for the writer beyond which a spill is dropped (counted)
_MODEL_SAMPLE_BYTES = 1 << 20  # of a model file's start and end, hashed for its identity


class DamagedState(ValueError):
    """A state file that does not read back as it was written."""


@dataclass(eq=False)
class DiskEntry:
    """A state file: the tokens its state holds at positions 0..len-1, and its size."""

    path: Path
    tokens: np.ndarray
    num_state_bytes: int
    num_file_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_file_bytes = _HEADER.size + 8 * len(self.tokens) + self.num_state_bytes


@dataclass
class DiskStats:
    num_written: int = 0
    num_read: int = 0
    num_evicted: int = 0
    num_damaged: int = 0  # files that failed their check and were removed
    num_failed_writes: int = 0  # a full disk, a folder gone: nothing kept, nothing damaged
    num_dropped: int = 0  # spills the writer could not take in time


@functools.lru_cache(maxsize=64)
def state_key(model_path: str, *settings: object) -> str:
    """The subfolder of states valid for this model file and these context settings: a hash of
    the file's size and its first and last megabyte (the same file found under another path is
    the same model), and of the settings. Read once per process for a file and settings (the
    engine's disk tier and every /slots save or restore ask; the model loaded is the file as it
    was then)."""
    digest = hashlib.blake2b(digest_size=12)
    path = Path(model_path)
    if path.is_file():
        size = path.stat().st_size
        digest.update(str(size).encode())
        with path.open("rb") as model:
            digest.update(model.read(_MODEL_SAMPLE_BYTES))
            model.seek(max(0, size - _MODEL_SAMPLE_BYTES))
            digest.update(model.read(_MODEL_SAMPLE_BYTES))
    else:  # not a file here (a test's backend): its name is all there is
        digest.update(model_path.encode())
    digest.update(repr(settings).encode())
    return digest.hexdigest()


class DiskTier:
    """State files under `folder`/`key`, found by the longest common prefix with a prompt, LRU-
    bounded in bytes. The engine's thread reads and looks up; the writer thread writes."""

    def __init__(self, folder: str | os.PathLike, limit_bytes: int, key: str) -> None:
        self.limit_bytes = limit_bytes
        self.folder = Path(folder) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        self._key_digest = _key_digest(key)
        self._lock = threading.Lock()  # the index and the byte counts, between the engine and the writer
        self._files: OrderedDict[str, DiskEntry] = OrderedDict()  # least recently used first
        # Handed to the writer, not yet written: found (and read from memory) meanwhile.
        self._pending: dict[str, tuple[DiskEntry, np.ndarray]] = {}
        self.num_bytes = 0  # the files' bytes
        self._num_reserved = 0  # bytes of writes under way (their partial files)
        self.stats = DiskStats()
        self._writes: queue.Queue = queue.Queue(maxsize=_PENDING_WRITES)
        self._writer: threading.Thread | None = None
        self._scan()

    # --- lookups (the engine's thread) -------------------------------------------------------

    @property
    def num_files(self) -> int:
        return len(self._files)

    def best_match(self, prompt: np.ndarray) -> tuple[DiskEntry | None, int]:
        """The file sharing the longest prefix with `prompt`, and that length."""
        best, best_length = None, 0
        for entry in self._entries():
            length = common_prefix_length(entry.tokens, prompt)
            if length > best_length:
                best, best_length = entry, length
        return best, best_length

    def covers(self, tokens: np.ndarray) -> bool:
        """Whether a file already holds these tokens (it starts with all of them)."""
        return any(starts_with(entry.tokens, tokens) for entry in self._entries())

    def read(self, entry: DiskEntry) -> np.ndarray | None:
        """The file's state, checked; None when it is gone or damaged (then removed and counted).
        It becomes the most recently used."""
        with self._lock:
            pending = self._pending.get(entry.path.name)
        if pending is not None:
            return pending[1]
        try:
            state = _read_state(entry, self._key_digest)
        except FileNotFoundError:  # another process's bound removed it
            self._forget(entry.path.name)
            return None
        except (OSError, DamagedState) as error:
            logger.warning("removing a damaged KV state file %s: %s", entry.path.name, error)
            self.stats.num_damaged += 1
            self._remove(entry.path.name)
            return None
        self.stats.num_read += 1
        with self._lock:
            if entry.path.name in self._files:
                self._files.move_to_end(entry.path.name)
        try:
            os.utime(entry.path)  # its use outlives the process
        except OSError:
            pass
        return state

    # --- writes --------------------------------------------------------------------------------

    def put(self, tokens: np.ndarray, state, wait: bool = False) -> bool:
        """Hand a state to the writer (wait: until it takes it; else dropped when it is busy);
        False when it is not taken."""
        if _HEADER.size + 8 * len(tokens) + len(state) > self.limit_bytes:
            return False
        self._start_writer()
        tokens = np.asarray(tokens, dtype=np.int64).copy()
        entry = DiskEntry(self.folder / (_name_of(tokens) + _SUFFIX), tokens, len(state))
        with self._lock:
            if entry.path.name in self._pending:  # being written already
                return True
            self._pending[entry.path.name] = (entry, _as_bytes(state))
        try:
            self._writes.put(entry, block=wait)
        except queue.Full:
            self.stats.num_dropped += 1
            with self._lock:
                del self._pending[entry.path.name]
            return False
        return True

    def flush(self) -> None:
        """Wait until every state handed over is written (or failed)."""
        if self._writer is not None:
            self._writes.join()

    def close(self) -> None:
        """Write what was handed over, then stop the writer."""
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join()
            self._writer = None

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_all, name="multiseq-disk-cache", daemon=True)
            self._writer.start()

    def _write_all(self) -> None:
        while (entry := self._writes.get()) is not None:
            try:
                self._write(entry)
            except Exception:  # noqa: BLE001 - a bug here must not stop the writes that follow
                logger.exception("writing a KV state file failed")
            finally:
                with self._lock:
                    self._pending.pop(entry.path.name, None)
                self._writes.task_done()
        self._writes.task_done()

    def _write(self, entry: DiskEntry) -> None:
        with self._lock:
            _, state = self._pending[entry.path.name]
        if not self._reserve(entry.num_file_bytes):
            self.stats.num_dropped += 1
            return
        partial = entry.path.with_name(f"{entry.path.name}.{os.getpid()}.{threading.get_ident()}{_PARTIAL}")
        try:
            _write_file(partial, entry.path, self._key_digest, entry.tokens, state)
        except OSError as error:  # a full disk, a folder removed: the partial file goes, nothing else
            logger.warning("a KV state was not written to %s: %s", self.folder, error)
            self.stats.num_failed_writes += 1
            partial.unlink(missing_ok=True)
            with self._lock:
                self._num_reserved -= entry.num_file_bytes
            return
        with self._lock:
            self._num_reserved -= entry.num_file_bytes
            replaced = self._files.pop(entry.path.name, None)
            self.num_bytes += entry.num_file_bytes - (replaced.num_file_bytes if replaced else 0)
            self._files[entry.path.name] = entry
        self.stats.num_written += 1

    def _reserve(self, num_bytes: int) -> bool:
        """Room for a file of num_bytes beside the others and the writes under way: the least
        recently used files are removed for it."""
        with self._lock:
            while self._files and self.num_bytes + self._num_reserved + num_bytes > self.limit_bytes:
                name = next(iter(self._files))
                self._unlink(name)
                self.stats.num_evicted += 1
            if self.num_bytes + self._num_reserved + num_bytes > self.limit_bytes:
                return False
            self._num_reserved += num_bytes
            return True

    # --- the index -----------------------------------------------------------------------------

    def _entries(self) -> list[DiskEntry]:
        with self._lock:
            return [*self._files.values(), *(entry for entry, _ in self._pending.values())]

    def _scan(self) -> None:
        """Index the folder's files, least recently used first: a partial file (a write a crash
        cut) is removed, and so is a file whose header does not read."""
        found: list[tuple[float, DiskEntry]] = []
        for path in self.folder.iterdir():
            if path.name.endswith(_PARTIAL):
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(_SUFFIX):
                continue
            try:
                found.append((path.stat().st_mtime, _read_entry(path, self._key_digest)))
            except (OSError, DamagedState) as error:
                logger.warning("removing a damaged KV state file %s: %s", path.name, error)
                self.stats.num_damaged += 1
                path.unlink(missing_ok=True)
        for _, entry in sorted(found, key=lambda item: item[0]):
            self._files[entry.path.name] = entry
            self.num_bytes += entry.num_file_bytes
        # Over the bound (a smaller bound than last time): the oldest go.
        with self._lock:
            while self._files and self.num_bytes > self.limit_bytes:
                self._unlink(next(iter(self._files)))
                self.stats.num_evicted += 1

    def _remove(self, name: str) -> None:
        with self._lock:
            self._unlink(name)

    def _forget(self, name: str) -> None:
        with self._lock:
            entry = self._files.pop(name, None)
            if entry is not None:
                self.num_bytes -= entry.num_file_bytes

    def _unlink(self, name: str) -> None:
        """Remove a file and its entry (the lock held)."""
        entry = self._files.pop(name, None)
        if entry is not None:
            self.num_bytes -= entry.num_file_bytes
            entry.path.unlink(missing_ok=True)


def save_state_file(path: Path, key: str, tokens: np.ndarray, state) -> int:
    """Write one state to a file of its own (llama-server's /slots save), as the tier writes
    its files; the bytes written."""
    tokens = np.asarray(tokens, dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}{_PARTIAL}")
    try:
        _write_file(partial, path, _key_digest(key), tokens, _as_bytes(state))
    finally:
        partial.unlink(missing_ok=True)
    return path.stat().st_size


def load_state_file(path: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    """A file save_state_file wrote, checked: its tokens and state (DamagedState: it does not
    read back as written, or was written for another model or settings)."""
    digest = _key_digest(key)
    entry = _read_entry(path, digest)
    return entry.tokens, _read_state(entry, digest)


def _key_digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def _name_of(tokens: np.ndarray) -> str:
    return hashlib.blake2b(tokens.tobytes(), digest_size=16).hexdigest()


def _as_bytes(state) -> np.ndarray:
    """A state (llama.cpp's bytes, a test's bytearray) as a flat byte array, not copied."""
    return state.view(np.uint8).reshape(-1) if isinstance(state, np.ndarray) else np.frombuffer(state, dtype=np.uint8)


def _write_file(partial: Path, final: Path, key_digest: bytes, tokens: np.ndarray, state: np.ndarray) -> None:
    """Write, sync and rename into place: a crash leaves the partial file or the whole one."""
    state_bytes = memoryview(state)
    token_bytes = tokens.astype("<i8").tobytes()
    crc = zlib.crc32(state_bytes, zlib.crc32(token_bytes))
    with partial.open("wb") as out:
        out.write(_HEADER.pack(_MAGIC, key_digest, len(tokens), len(state_bytes), crc))
        out.write(token_bytes)
        out.write(state_bytes)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, final)
    folder = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _read_header(data: bytes, key_digest: bytes, file_size: int) -> tuple[int, int, int]:
    if len(data) < _HEADER.size:
        raise DamagedState("shorter than its header")
    magic, key, num_tokens, num_state_bytes, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise DamagedState("not a multiseq KV state file")
    if key != key_digest:
        raise DamagedState("written for another model or context settings")
    if file_size != _HEADER.size + 8 * num_tokens + num_state_bytes:
        raise DamagedState(f"{file_size} bytes where its header says {_HEADER.size + 8 * num_tokens + num_state_bytes}")
    return num_tokens, num_state_bytes, crc


def _read_entry(path: Path, key_digest: bytes) -> DiskEntry:
    """A file's entry from its header and tokens (its state is read, and checked, when used)."""
    with path.open("rb") as source:
        num_tokens, num_state_bytes, _ = _read_header(source.read(_HEADER.size), key_digest, path.stat().st_size)
        tokens = np.frombuffer(source.read(8 * num_tokens), dtype="<i8").astype(np.int64)
    return DiskEntry(path, tokens, num_state_bytes)


def _read_state(entry: DiskEntry, key_digest: bytes) -> np.ndarray:
    """The file's state, its header, tokens and checksum checked against what was indexed."""
    with entry.path.open("rb") as source:
        size = os.fstat(source.fileno()).st_size
        num_tokens, num_state_bytes, crc = _read_header(source.read(_HEADER.size), key_digest, size)
        token_bytes = source.read(8 * num_tokens)
        state = np.empty(num_state_bytes, dtype=np.uint8)
        if source.readinto(memoryview(state)) != num_state_bytes:
            raise DamagedState("cut short")
    if zlib.crc32(state, zlib.crc32(token_bytes)) != crc:
        raise DamagedState("its checksum does not match")
    if not np.array_equal(np.frombuffer(token_bytes, dtype="<i8"), entry.tokens):
        raise DamagedState("its tokens changed since it was indexed")
    return state
