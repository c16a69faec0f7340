"""A slot's saved KV state, rewritten for a context with another number of KV streams.

llama.cpp writes one sequence's state per KV stream of its context (one stream per slot with a
window each, one stream for a pool) and will not read it into a context with another number
of streams ("n_stream mismatch"). The cells are the same bytes in either layout: only the
stream headers differ. So a state saved with windows is restored into a pool (and back) by
rewriting its headers, which lets the backend change layout between steps and lets host memory
and other replicas hand states across layouts.

Imports nothing of llama_cpp. The format (llama-kv-cache.cpp, state_write for one sequence),
after a header (llama_context::state_seq_get_data: u32 magic, i32 the sequence it was saved
from), once per KV cache of the model (two for a model with sliding-window layers: the full
cache, then the window's):

    u32 n_stream
    n_stream times:  u32 cell_count, then (when it is not 0) the cells:
        cell_count x (i32 pos, u32 n_seq_id = 1, [an ext of 12 bytes: M-RoPE, PLE], i32 seq_id)
        u32 v_trans, u32 n_layer
        K, n_layer times:  i32 type, u64 row_size, cell_count x row_size bytes
        V, once per layer that has one (none for MLA), not transposed:
                           i32 type, u64 row_size, cell_count x row_size bytes
                        or transposed:
                           i32 type, u32 element_size, u32 n_embd_v, n_embd_v x cell_count x element_size bytes

One sequence's cells are all in one stream (its own, or the pool's); the other streams say 0.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

# The ways a model's cells may be written, tried in turn: bytes of llama_kv_cell_ext (x, y, tok),
# written only by models that need it; whether V is kept (MLA keeps none).
_CELL_LAYOUTS = ((0, True), (12, True), (0, False), (12, False))


_HEADER_BYTES = 8


class StateFormatError(ValueError):
    """The bytes are not a one-sequence KV state as this module reads them."""


@dataclass(frozen=True, slots=True)
class _Block:
    """One KV cache's part of a state: where its cells lie in the bytes (None: no cells)."""

    num_streams: int
    cell_count: int
    cells: tuple[int, int] | None  # [start, end) of the cells' bytes
    end: int


def num_streams(state) -> int:
    """The stream count the state was written for (its first header)."""
    if len(state) < _HEADER_BYTES + 4:
        raise StateFormatError(f"a KV state is at least {_HEADER_BYTES + 4} bytes")
    return struct.unpack_from("<I", memoryview(state).cast("B"), _HEADER_BYTES)[0]


def cell_count(state) -> int:
    """How many positions the state holds (its full cache's cells)."""
    return _blocks(memoryview(state).cast("B"))[0].cell_count


def cell_positions(state) -> np.ndarray:
    """The positions of the state's cells (its full cache's), in the order saved: one row per
    cell of its position and, where the model keeps 2-D positions (M-RoPE), its x and y (else
    0, 0)."""
    view = memoryview(state).cast("B")
    blocks, ext_bytes = _layout(view)
    block = blocks[0]
    if not block.cells:
        return np.zeros((0, 3), dtype=np.int32)
    start = block.cells[0]
    words = np.frombuffer(view[start:start + block.cell_count * (12 + ext_bytes)], dtype=np.int32).reshape(
        block.cell_count, -1)
    if not ext_bytes:  # pos, n_seq_id, seq_id
        return np.column_stack([words[:, 0], np.zeros((block.cell_count, 2), dtype=np.int32)])
    return words[:, [0, 2, 3]].copy()  # pos, n_seq_id, ext (x, y, tok), seq_id


def restreamed(state, streams: int) -> np.ndarray:
    """The state as a context with `streams` KV streams reads it (the same bytes where it
    already has that many: every KV cache of one context has its stream count, so the first
    header says, and a restore in the layout it was saved in reads nothing more)."""
    if num_streams(state) == streams:
        return state if isinstance(state, np.ndarray) else np.frombuffer(state, dtype=np.uint8)
    view = memoryview(state).cast("B")
    blocks = _blocks(view)
    size = _HEADER_BYTES + sum(4 + 4 * streams + (block.cells[1] - block.cells[0] if block.cells else 0)
                               for block in blocks)
    out = np.empty(size, dtype=np.uint8)
    at = _put(out, 0, view[:_HEADER_BYTES])
    for block in blocks:
        # The cells go in the first stream: llama.cpp puts a one-sequence state's cells in the
        # sequence's own stream whichever header held them. The other streams say 0.
        at = _put(out, at, struct.pack("<II", streams, block.cell_count))
        if block.cells:
            start, end = block.cells
            at = _put(out, at, view[start:end])
        at = _put(out, at, bytes(4 * (streams - 1)))
    return out


def _put(out: np.ndarray, at: int, data) -> int:
    data = np.frombuffer(data, dtype=np.uint8)
    out[at:at + len(data)] = data
    return at + len(data)


def _blocks(view: memoryview) -> list[_Block]:
    return _layout(view)[0]


def _layout(view: memoryview) -> tuple[list[_Block], int]:
    """The state's KV caches, read for each cell layout the format allows; the one that reads
    the bytes exactly, end to end; and the bytes of a cell's ext in it."""
    for ext_bytes, has_v in _CELL_LAYOUTS:
        try:
            blocks, at = [], _HEADER_BYTES
            while at < len(view):
                block = _block(view, at, ext_bytes, has_v)
                blocks.append(block)
                at = block.end
            if blocks:
                return blocks, ext_bytes
        except (StateFormatError, struct.error):
            continue
    raise StateFormatError("not a one-sequence KV state of a known layout")


def _block(view: memoryview, at: int, ext_bytes: int, has_v: bool) -> _Block:
    (streams,) = struct.unpack_from("<I", view, at)
    if not 1 <= streams <= 4096:
        raise StateFormatError(f"{streams} streams")
    at += 4
    found: tuple[int, tuple[int, int]] | None = None
    for _ in range(streams):
        (count,) = struct.unpack_from("<I", view, at)
        at += 4
        if count == 0:
            continue
        if found is not None:
            raise StateFormatError("cells in two streams: not one sequence's state")
        start = at
        at = _cells_end(view, at, count, ext_bytes, has_v)
        found = (count, (start, at))
    count, cells = found if found else (0, None)
    return _Block(streams, count, cells, at)


def _cells_end(view: memoryview, at: int, count: int, ext_bytes: int, has_v: bool) -> int:
    """Where the cells of one stream that start at `at` end."""
    cell_bytes = 12 + ext_bytes
    if at + count * cell_bytes > len(view):
        raise StateFormatError("cells run past the end")
    cells = np.frombuffer(view[at:at + count * cell_bytes], dtype=np.uint32).reshape(count, cell_bytes // 4)
    if np.any(cells[:, 1] != 1):
        raise StateFormatError("a cell of several sequences")
    at += count * cell_bytes
    v_trans, n_layer = struct.unpack_from("<II", view, at)
    if v_trans not in (0, 1) or n_layer > 4096:
        raise StateFormatError("no layer header where one belongs")
    at += 8
    for _ in range(n_layer):  # K
        at = _rows_end(view, at, count)
    if not has_v:
        return at
    for _ in range(n_layer):  # V
        at = _rows_end(view, at, count) if not v_trans else _transposed_end(view, at, count)
    if at > len(view):
        raise StateFormatError("cells run past the end")
    return at


def _rows_end(view: memoryview, at: int, count: int) -> int:
    type_id, row_size = struct.unpack_from("<iQ", view, at)
    if not 0 <= type_id < 256 or row_size == 0:
        raise StateFormatError("no tensor header where one belongs")
    return at + 12 + count * row_size


def _transposed_end(view: memoryview, at: int, count: int) -> int:
    type_id, element_size, n_embd = struct.unpack_from("<iII", view, at)
    if not 0 <= type_id < 256 or element_size == 0:
        raise StateFormatError("no tensor header where one belongs")
    return at + 12 + n_embd * count * element_size

