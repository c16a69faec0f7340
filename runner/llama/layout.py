"""Moving every slot's KV into a context of the other layout (LlamaBackend.relayout).

A windows context holds each slot in a KV stream of its own; a pool holds them all in one
stream, where a prefix two slots share is one set of cells. The slots' states are taken from
the old context (kv_states rewrites their stream headers for the new one) and put into the new
one at the same positions. Into a pool, a slot that shares its first positions with a slot put
back before it takes those cells instead of bringing its own copy, so the pool holds what the
engine's ledger counts; a slot whose copy of another stream llama.cpp has only queued (done at
the next llama_decode) is remade from its source, never read.

Imports nothing of llama_cpp: it works through SlotKv.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BackendError
from .batch import SlotState
from .kv import SlotKv


@dataclass(frozen=True, slots=True)
class MovedSlot:
    slot: int
    state: SlotState | None  # positions from `shared` on (None: nothing of its own)
    shared: int = 0  # its first positions, taken from `source` in the new context
    source: int | None = None


def moved_states(slot_kv: SlotKv, num_slots: int, shares: dict[int, tuple[int, int]]) -> list[MovedSlot]:
    """What each slot holds, in the order to put it back: sources before the slots that share
    their cells, a slot awaiting a stream copy after its source."""
    moved: list[MovedSlot] = []
    awaiting = dict(slot_kv.awaiting_copy)
    for slot in range(num_slots):
        if slot in awaiting or slot_kv.slot_pos_max(slot) < 0:
            continue
        source, length = shares.get(slot, (None, 0))
        if source is not None and (source in awaiting or source > slot or slot_kv.slot_pos_max(source) < 0):
            source, length = None, 0  # only a slot put back before it can lend its cells
        if length:
            slot_kv.drop_front(slot, length)  # the old context goes: its cells need not stay whole
        state = slot_kv.save_slot(slot) if slot_kv.slot_pos_max(slot) >= 0 else None
        if state is None and slot_kv.slot_pos_max(slot) >= 0:
            raise BackendError(f"llama.cpp could not save slot {slot}'s KV to change the layout")
        moved.append(MovedSlot(slot, state, length, source))
    for slot, (source, length) in _in_copy_order(awaiting):
        moved.append(MovedSlot(slot, None, length, source))
    return moved


def put_back(slot_kv: SlotKv, moved: list[MovedSlot]) -> None:
    """Into the new context: each slot's own cells, then the cells it shares."""
    for item in moved:
        if item.state is not None and not slot_kv.load_state(item.slot, item.state):
            raise BackendError(f"llama.cpp could not take back slot {item.slot}'s KV in the new layout")
        if item.shared:
            if slot_kv.num_streams == 1:
                slot_kv.share_front(item.slot, item.source, item.shared)
            else:
                raise BackendError("a slot's shared cells can only be taken from another slot in one pool")


def _in_copy_order(awaiting: dict[int, tuple[int, int]]) -> list[tuple[int, tuple[int, int]]]:
    """Queued copies, each after the copy that makes its source (a chain A -> B -> C)."""
    ordered, done = [], set()
    while len(ordered) < len(awaiting):
        ready = [(slot, copy) for slot, copy in awaiting.items()
                 if slot not in done and (copy[0] not in awaiting or copy[0] in done)]
        if not ready:  # copies that wait on each other: none has a source with its cells
            raise BackendError(f"queued KV copies wait on each other: {sorted(set(awaiting) - done)}")
        ordered += ready
        done.update(slot for slot, _ in ready)
    return ordered
