"""Which layout a KV pool is held in, step by step (RunnerConfig.kv_layout "auto").

On the CPU, a decoding row in llama.cpp's unified KV reads the mask of every cell up to the
highest in use, the other sequences' included, where a window per slot holds only its own
(bench/pool_attention.py: 1.10x a window's step at best; the agent-sessions load lost 11% in
the pool). What the pool gives is room: a session longer than a window, a prefix held once. So
the backend holds the pool's cells in a window per slot while every slot's KV fits its window,
and moves them into one pool at the step a slot needs more (a longer prompt, a restored
conversation, a generation reaching the window's end); once no slot has needed more for
POOL_DWELL_SECONDS, back to windows. Moving is a save and restore of every slot's cells (a few
hundred milliseconds for a pool of 16k tokens of a small model, on this CPU), so the dwell keeps
a load at the edge from paying it often. The engine's ledger counts one pool either way: what
is admitted, kept and evicted does not change with the layout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..llama.batch import BatchEntry, SlotState
from ..llama.kv_states import StateFormatError, cell_count

logger = logging.getLogger("multiseq.runner")

POOL_DWELL_SECONDS = 20.0


class LayoutChoice:
    """Moves a backend that can change layout (its layout_window is set) between windows and
    one pool, before the KV operations that need it; `ledger` is the pool's CellLedger."""

    def __init__(self, backend, ledger, dwell_seconds: float = POOL_DWELL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backend = backend
        self._ledger = ledger
        self.window: int = backend.layout_window
        self._dwell = dwell_seconds
        self._clock = clock
        self._pool_needed_at = clock()
        self.num_moves = 0
        self.move_seconds = 0.0

    @property
    def pooled(self) -> bool:
        return self._backend.pooled

    def before_decode(self, entries: list[BatchEntry]) -> None:
        self._fit(max((entry.start_pos + len(entry.tokens) for entry in entries), default=0))

    def before_restore(self, state: SlotState, length: int) -> None:
        """A restored state is loaded whole, then cut back to `length`: all of it must fit."""
        try:
            length = max(length, cell_count(state))
        except StateFormatError:
            pass  # llama.cpp will not load it either: the restore fails and the prompt is computed
        self._fit(length)

    def _fit(self, positions: int) -> None:
        now = self._clock()
        if positions > self.window:
            self._pool_needed_at = now
            if not self.pooled:
                self._move(True, f"a slot needs {positions} positions, more than its window of {self.window}")
            return
        if not self.pooled or now - self._pool_needed_at < self._dwell:
            return
        longest = max(self._ledger.length(slot) for slot in range(self._backend.num_slots))
        if longest > self.window:
            self._pool_needed_at = now
            return
        self._move(False, f"every slot has fitted its window of {self.window} for {self._dwell:.0f} s")

    def _move(self, pooled: bool, why: str) -> None:
        started = time.perf_counter()
        self._backend.relayout(pooled, self._ledger.leading_shares() if pooled else {})
        seconds = time.perf_counter() - started
        self.num_moves += 1
        self.move_seconds += seconds
        logger.info("KV held in %s from now on (%s): moved in %.0f ms", "one pool" if pooled else "a window per slot",
                    why, 1000 * seconds)
