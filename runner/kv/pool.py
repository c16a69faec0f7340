"""The cells of one KV pool shared by the slots (llama.cpp's unified KV), counted in Python.

In a pool, a slot's KV is a list of cells in position order, and a prefix given from one slot
to another is the same cells, not a copy (llama_memory_seq_cp within one stream only marks
them). So the cells in use are fewer than the tokens the slots hold, and admission must count
cells, not tokens. llama.cpp does not say how many of its cells are used; the ledger here
follows every KV operation the engine makes (through PoolTracking, which wraps the backend)
and knows, at any moment, the cells in use, the cells each slot alone holds (what clearing it
frees), and how far a slot's cells are shared (a shift may move only cells no one else reads:
llama.cpp keeps one position per cell, so moving a shared cell would move it for every slot).

A cell is named by the run of cells it was computed in and its place in that run. A slot
computes into a run of its own, started afresh whenever its KV is cut, cleared or given a
prefix, so a cell another slot was given is never confused with one computed later.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

import numpy as np

from ..llama.batch import BatchEntry, SlotState
from .layout_choice import LayoutChoice


@dataclass(frozen=True, slots=True)
class _Span:
    """Consecutive cells of one run: places [start, end) of run `run`."""

    run: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


class CellLedger:
    """Which cells of a pool of `size` cells each slot's KV is made of."""

    def __init__(self, num_slots: int, size: int) -> None:
        self.size = size
        self._runs = count()
        self._spans: list[list[_Span]] = [[] for _ in range(num_slots)]
        self._own_run = [next(self._runs) for _ in range(num_slots)]  # where each slot computes

    # --- what the KV holds -------------------------------------------------------------------

    def length(self, slot: int) -> int:
        """The positions the slot's KV holds."""
        return sum(span.length for span in self._spans[slot])

    @property
    def num_used(self) -> int:
        """Cells in use: each counted once, however many slots hold it."""
        return sum(_covered(intervals) for intervals in self._by_run(range(len(self._spans))).values())

    @property
    def num_free(self) -> int:
        return max(0, self.size - self.num_used)

    @property
    def num_held(self) -> int:
        """Positions the slots hold, all together (a shared cell counted once per slot)."""
        return sum(self.length(slot) for slot in range(len(self._spans)))

    @property
    def num_reused(self) -> int:
        """Positions held on cells some other slot holds too: what sharing saves."""
        return self.num_held - self.num_used

    def only_in(self, slot: int) -> int:
        """Cells no other slot holds: what clearing the slot gives back to the pool."""
        others = self._by_run(s for s in range(len(self._spans)) if s != slot)
        mine = self._by_run([slot])
        return sum(_covered(intervals) - _covered_within(intervals, others.get(run, []))
                   for run, intervals in mine.items())

    def shared_extent(self, slot: int) -> int:
        """How many leading positions of the slot are cells another slot holds too (a shared
        prefix: the rest of the slot's cells are its own)."""
        others = self._by_run(s for s in range(len(self._spans)) if s != slot)
        extent = position = 0
        for span in self._spans[slot]:
            for start, end in others.get(span.run, []):
                low, high = max(start, span.start), min(end, span.end)
                if low < high:
                    extent = max(extent, position + high - span.start)
            position += span.length
        return extent

    def leading_shares(self) -> dict[int, tuple[int, int]]:
        """For each slot whose first cells a slot of a lower number holds too: that slot and
        how many positions (the longest such run), as a pool built slot by slot can share them."""
        shares = {}
        for slot in range(1, len(self._spans)):
            best = max(((_common_front(self._spans[slot], self._spans[other]), other) for other in range(slot)))
            if best[0]:
                shares[slot] = (best[1], best[0])
        return shares

    # --- what the engine did -----------------------------------------------------------------

    def grow(self, slot: int, new_length: int) -> None:
        """The slot computed positions up to new_length into cells of its own."""
        added = new_length - self.length(slot)
        if added <= 0:
            return
        spans = self._spans[slot]
        own = self._own_run[slot]
        if spans and spans[-1].run == own:
            last = spans[-1]
            spans[-1] = _Span(own, last.start, last.end + added)
        else:
            start = max((span.end for span in spans if span.run == own), default=0)
            spans.append(_Span(own, start, start + added))

    def share(self, slot: int, source: int, length: int) -> None:
        """The slot now holds the source's first `length` cells (and nothing else)."""
        self._spans[slot] = _first(self._spans[source], length)
        self._own_run[slot] = next(self._runs)

    def cut(self, slot: int, length: int) -> None:
        """The slot keeps its first `length` positions."""
        self._spans[slot] = _first(self._spans[slot], length)
        self._own_run[slot] = next(self._runs)

    def fill(self, slot: int, length: int) -> None:
        """The slot's KV was written afresh (a restored state): `length` cells of its own."""
        self._spans[slot] = []
        self._own_run[slot] = next(self._runs)
        self.grow(slot, length)

    def drop(self, slot: int, keep: int, discard: int) -> None:
        """A shift: the slot drops positions [keep, keep + discard); the cells after them move
        back (the same cells, at other positions)."""
        spans = self._spans[slot]
        self._spans[slot] = _first(spans, keep) + _after(spans, keep + discard)

    def _by_run(self, slots) -> dict[int, list[tuple[int, int]]]:
        runs: dict[int, list[tuple[int, int]]] = {}
        for slot in slots:
            for span in self._spans[slot]:
                runs.setdefault(span.run, []).append((span.start, span.end))
        return runs


def _first(spans: list[_Span], length: int) -> list[_Span]:
    kept, position = [], 0
    for span in spans:
        if position >= length:
            break
        take = min(span.length, length - position)
        kept.append(_Span(span.run, span.start, span.start + take))
        position += take
    return kept


def _after(spans: list[_Span], position: int) -> list[_Span]:
    rest, start = [], 0
    for span in spans:
        end = start + span.length
        if end > position:
            skip = max(0, position - start)
            rest.append(_Span(span.run, span.start + skip, span.end))
        start = end
    return rest


def _common_front(spans: list[_Span], others: list[_Span]) -> int:
    """How many first positions two slots hold on the same cells."""
    length = 0
    for mine, theirs in zip(spans, others):
        if (mine.run, mine.start) != (theirs.run, theirs.start):
            break
        length += min(mine.end, theirs.end) - mine.start
        if mine.end != theirs.end:
            break
    return length


def _covered(intervals: list[tuple[int, int]]) -> int:
    """How many places the intervals cover together."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _covered_within(mine: list[tuple[int, int]], others: list[tuple[int, int]]) -> int:
    """Of the places `mine` cover, how many `others` cover too."""
    if not others:
        return 0
    both = [(max(a, c), min(b, d)) for a, b in mine for c, d in others if max(a, c) < min(b, d)]
    return _covered(both)


class PoolTracking:
    """A backend whose KV operations are followed in a CellLedger. Everything else passes
    through: the engine holds this in the backend's place when the slots share one pool."""

    def __init__(self, backend, ledger: CellLedger) -> None:
        self._backend = backend
        self.ledger = ledger
        # A backend that holds the pool in windows while they fit: moved before what needs more.
        self.layout = LayoutChoice(backend, ledger) if backend.layout_window else None

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def decode(self, entries: list[BatchEntry]) -> np.ndarray:
        if self.layout is not None:
            self.layout.before_decode(entries)
        rows = self._backend.decode(entries)
        for entry in entries:
            self.ledger.grow(entry.slot, entry.start_pos + len(entry.tokens))
        return rows

    def reuse_prefix(self, slot: int, source_slot: int, length: int) -> bool:
        intact = self._backend.reuse_prefix(slot, source_slot, length)
        if not intact:
            self.ledger.cut(slot, 0)
        elif source_slot == slot:
            self.ledger.cut(slot, length)
        else:
            self.ledger.share(slot, source_slot, length)
        return intact

    def undo_failed_decode(self, slot: int, start_pos: int) -> bool:
        intact = self._backend.undo_failed_decode(slot, start_pos)
        self.ledger.cut(slot, start_pos if intact else 0)
        return intact

    def rewind_slot(self, slot: int, length: int) -> bool:
        intact = self._backend.rewind_slot(slot, length)
        self.ledger.cut(slot, length if intact else 0)
        return intact

    def restore_slot(self, slot: int, state: SlotState, length: int) -> bool:
        if self.layout is not None:
            self.layout.before_restore(state, length)
        intact = self._backend.restore_slot(slot, state, length)
        self.ledger.fill(slot, length if intact else 0)
        return intact

    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None:
        assert self.ledger.shared_extent(slot) <= keep + discard, "a shift never moves a cell another slot holds"
        self._backend.shift_slot(slot, keep, discard, n_past)
        self.ledger.drop(slot, keep, discard)
