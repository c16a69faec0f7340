"""The KV cache of a llama.cpp context: its element types and their sizes, and each slot's KV
(`SlotKv`: cleared, shared, cut back, shifted, saved, restored).

Imports nothing of llama_cpp: SlotKv calls the library multiseq.llama.backend (its only importer)
hands it, on the context it made.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from types import ModuleType

import numpy as np

from .batch import SlotState
from .kv_states import StateFormatError, cell_positions, restreamed
from .positions import SlotPositions

# The KV cache types by llama.cpp's names (-ctk/-ctv), as ggml's enum (ggml.h) numbers them;
# llama-cpp-python does not export them all (no GGML_TYPE_BF16).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
# Bytes per value of each KV type (ggml's block size and bytes per block: q8_0 is 34 bytes per 32).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
_STATE_FLAGS = 0  # LLAMA_STATE_SEQ_FLAGS_NONE: the whole state, in host memory


def kv_bytes_per_token(metadata_int: Callable[[str], int | None], cache_types: tuple[str, str]) -> int | None:
    """The KV cache's bytes for one token in every layer, with these K and V types, from a
    GGUF's metadata (`metadata_int` reads one integer under the model's architecture): each
    layer keeps head_count_kv keys and values of the key and value lengths (a full-size
    sliding-window cache, multiseq's default, is as large as the full one). None when the
    metadata does not say (a per-layer head count, say)."""
    n_layer, n_head = metadata_int("block_count"), metadata_int("attention.head_count")
    n_head_kv = metadata_int("attention.head_count_kv") or n_head
    embedding = metadata_int("embedding_length")
    if not (n_layer and n_head and n_head_kv and embedding):
        return None
    key_length = metadata_int("attention.key_length") or embedding // n_head
    value_length = metadata_int("attention.value_length") or embedding // n_head
    per_layer = n_head_kv * (key_length * KV_TYPE_BYTES[cache_types[0]] + value_length * KV_TYPE_BYTES[cache_types[1]])
    return int(n_layer * per_layer)


def mapped_bytes(size: int) -> np.ndarray:
    """A writable byte array in pages of its own (an anonymous mmap), given back to the system
    when the array goes: the RAM tier saves and evicts states of tens of megabytes all the time,
    and from malloc's heap their freed memory stayed in the process (bench/soak.py: RSS beside a
    full --cache-ram grew by 1.2 GiB in ten minutes)."""
    return np.frombuffer(mmap.mmap(-1, max(size, 1)), dtype=np.uint8)[:size]


class SlotKv:
    """Each slot's KV in one llama.cpp context: one KV stream per slot, or (`is_pool`) one pool
    of cells the slots share. `n_swa` is the model's sliding window (0: none)."""

    def __init__(self, llama: ModuleType, ctx, is_pool: bool, n_swa: int, num_slots: int) -> None:
        self._llama = llama
        self._n_swa = n_swa
        self._num_slots = num_slots
        self.rebind(ctx, is_pool)
        self.can_shift = bool(llama.llama_memory_can_shift(self._memory))
        # Where each slot's tokens stand in the model's positions: its index, but after an image
        # of a model with M-RoPE (`stretches`: the backend's projector places images so). Every
        # length below is in tokens, and translated here.
        self.positions = SlotPositions()
        self.stretches = False

    def rebind(self, ctx, is_pool: bool) -> None:
        """Work on another context (the backend's, after it changed layout)."""
        self._ctx = ctx
        self._memory = self._llama.llama_get_memory(ctx)
        self._is_pool = is_pool
        # Slots given another stream's prefix whose copy llama.cpp has queued for the next
        # llama_decode: slot -> (source slot, length). Their own stream is not written yet.
        self.awaiting_copy: dict[int, tuple[int, int]] = {}

    @property
    def num_streams(self) -> int:
        return 1 if self._is_pool else self._num_slots

    def decoded(self) -> None:
        """A llama_decode ran: llama.cpp made the queued stream copies first."""
        self.awaiting_copy.clear()

    def clear_slot(self, slot: int) -> None:
        self._llama.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self.awaiting_copy.pop(slot, None)
        self.positions.clear(slot)

    def reuse_prefix(self, slot: int, source_slot: int, length: int) -> bool:
        """Make the slot's KV hold positions [0, length) of the source slot's.

        In one pool the slot is given the source's cells for those positions (they are shared,
        at once, no data copied). Between two KV streams llama.cpp copies only whole streams (a
        partial range aborts the process), so the whole stream is copied and then cut back to
        the prefix; that copy is queued and done at the start of the next llama_decode, before
        that decode writes anything. False (and the slot cleared) when the prefix is not intact."""
        if source_slot != slot and self._is_pool:
            self.clear_slot(slot)
            if length > 0:
                self.share_front(slot, source_slot, length)
        elif source_slot != slot:
            self._llama.llama_memory_seq_cp(self._memory, source_slot, slot, -1, -1)
            self.awaiting_copy[slot] = (source_slot, length)
        self.positions.copy(slot, source_slot)
        return self.cut_back(slot, length)

    def share_front(self, slot: int, source_slot: int, length: int) -> None:
        """In a pool: the slot also holds the source's cells for its first `length` tokens."""
        end = self.positions.position(source_slot, length)
        self._llama.llama_memory_seq_cp(self._memory, source_slot, slot, 0, end)

    def drop_front(self, slot: int, length: int) -> None:
        """The slot lets go of its first `length` tokens' cells (the rest keep their positions)."""
        self._llama.llama_memory_seq_rm(self._memory, slot, 0, self.positions.position(slot, length))

    def undo_failed_decode(self, slot: int, start_pos: int) -> bool:
        return self.cut_back(slot, start_pos)

    def rewind_slot(self, slot: int, length: int) -> bool:
        return self.cut_back(slot, length)

    def save_slot(self, slot: int) -> SlotState | None:
        """The slot's KV state (llama_state_seq_get_data), to restore later; None on failure.
        The buffer is left unfilled until llama.cpp writes it, without the GIL: zero-filling
        a bytearray of a 2,000-token SmolLM2 state (41 MB) held the GIL for 23 ms, a pause in
        every other thread (the server's event loop among them)."""
        llama = self._llama
        size = llama.llama_state_seq_get_size_ext(self._ctx, slot, _STATE_FLAGS)
        state = mapped_bytes(size)
        written = llama.llama_state_seq_get_data_ext(self._ctx, (ctypes.c_uint8 * size).from_buffer(state), size,
                                                     slot, _STATE_FLAGS)
        return state if size and written == size else None

    def restore_slot(self, slot: int, state: SlotState, length: int) -> bool:
        """Put a saved state into the slot (llama.cpp clears it first, and writes at once, not
        at the next decode), cut back to positions [0, length). False (and the slot cleared)
        when it does not load or the prefix is not intact."""
        if not self.load_state(slot, state):
            self.clear_slot(slot)
            return False
        if self.stretches:
            self.positions.read_cells(slot, cell_positions(state))
        return self.cut_back(slot, length)

    def load_state(self, slot: int, state: SlotState) -> bool:
        """Put a saved state into the slot as it was saved, in this context's layout (a state
        saved with windows goes into a pool and back: kv_states). False when it does not load."""
        self.awaiting_copy.pop(slot, None)
        try:
            state = restreamed(state, self.num_streams)
        except StateFormatError:
            return False
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        read = self._llama.llama_state_seq_set_data_ext(self._ctx, buffer, len(state), slot, _STATE_FLAGS)
        return read == len(state)

    def cut_back(self, slot: int, length: int) -> bool:
        """Keep positions [0, length) of the slot; whether what the next tokens need is there.

        A sliding-window cache keeps (and saves) only the cells inside its window, and
        llama_memory_seq_pos_min reports that cache's first position: tokens from `length` on
        attend to the window before it, so those n_swa positions must be there (all positions
        for a model without one). Otherwise the slot is cleared and False returned."""
        llama = self._llama
        positions = self.positions
        last_kept = positions.last_position(slot, length)  # a medium cut through: its cells go, it fails
        removed = llama.llama_memory_seq_rm(self._memory, slot, positions.position(slot, length), -1)
        needed_from = positions.position(slot, max(0, length - self._n_swa)) if self._n_swa else 0
        positions.cut(slot, length)
        if slot in self.awaiting_copy:
            source, copied = self.awaiting_copy[slot]
            self.awaiting_copy[slot] = (source, min(copied, length))
        if length == 0:
            self.awaiting_copy.pop(slot, None)
            return True
        intact = (removed and 0 <= llama.llama_memory_seq_pos_min(self._memory, slot) <= needed_from
                  and llama.llama_memory_seq_pos_max(self._memory, slot) == last_kept)
        if not intact:
            self.clear_slot(slot)
        return intact

    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None:
        """Drop positions [keep, keep+discard) and move the rest back by `discard`."""
        self._llama.llama_memory_seq_rm(self._memory, slot, keep, keep + discard)
        self._llama.llama_memory_seq_add(self._memory, slot, keep + discard, n_past, -discard)

    def slot_pos_max(self, slot: int) -> int:
        """The largest position in the slot's KV, -1 when empty."""
        return self._llama.llama_memory_seq_pos_max(self._memory, slot)

    def slot_pos_min(self, slot: int) -> int:
        """The smallest position in the slot's KV, -1 when empty."""
        return self._llama.llama_memory_seq_pos_min(self._memory, slot)
