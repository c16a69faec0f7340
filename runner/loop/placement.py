"""Where a sequence's KV lives between the backend's slots and the host-memory (RAM) tier.

The engine decides *that* something happens (admit, preempt, retire, shift); this module does
the KV side of it: a reused prefix copied from another slot, kept in the slot or restored from
host memory; what a slot held saved to host memory before it is overwritten; a preempted
sequence's KV parked and restored; a finished sequence's KV kept as a prefix; full windows
shifted. Single-threaded, like the engine it serves.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..llama.batch import Backend, SlotState
from ..kv.hostcache import MIN_SAVE_TOKENS, HostCache, PrefixHolding, SharedPrefix
from ..kv.prefix import KeptScores
from .scheduler import Admission, IdleEviction, Placement, Scheduler
from .sequence import Sequence, SequenceStatus, reusable_kv_tokens
from .stats import StatsRecorder

logger = logging.getLogger("multiseq.runner")


class KvPlacement:
    """The KV of the engine's sequences, across the backend's slots and host memory."""

    def __init__(self, backend: Backend, scheduler: Scheduler, host_cache: HostCache, stats: StatsRecorder) -> None:
        self.backend = backend
        self.scheduler = scheduler
        self.host_cache = host_cache
        self.stats = stats

    def place_admitted(self, now: float) -> None:
        """Carry out the admissions Scheduler.admit decides: each sequence's slot's KV starts
        with its reused prefix, copied from another slot, kept from the slot's last request, or
        restored from host memory. What the slot held and the new sequence does not keep is saved to host memory
        first (when worth it). A prefix that is not intact after all (a sliding-window cache
        keeps only its window) is dropped, and the whole prompt is prefilled: a wrong reuse
        never becomes wrong text."""
        for admission in self.scheduler.admit(now):
            seq, placement = admission.seq, admission.placement
            for idle in admission.idle_evictions:
                self._evict_idle(idle)
            self._save_what_is_lost(admission)
            if admission.resumes:
                self._resume(seq, placement)
                continue
            if not self._place_prefix(placement):
                logger.info("a prefix of %d tokens for %s is not intact; prefilling it in full",
                            placement.num_cached, seq.id)
                seq.drop_cached_prefix()
            self.stats.note_admission(seq.num_cached, seq.num_restored)

    def preempt(self, now: float) -> None:
        """Give slots held by lower-priority sequences to waiting ones of higher priority: each
        preempted sequence's KV is parked in host memory, and restored when it resumes, so it
        goes on exactly where it stopped. Without room in host memory nothing is preempted
        (recomputing its KV would not give the same numbers)."""
        for victim in self.scheduler.preemptions(now):
            if not self._park(victim, now, "for a request of higher priority"):
                return

    def make_room(self, now: float) -> list[Sequence]:
        """In a shared KV pool, room for the next step: a cell for each decoding token, and
        cells for prompt chunks up to a step's budget. The kept prefixes of free slots go
        first, least recently used first (to host memory, when worth it); then, for the
        decoding tokens, running sequences leave, the lowest priority and the most recently
        admitted first: one still prefilling waits again, a decoding one is parked in host
        memory to resume exactly. Returns a sequence that could not be parked (no room in
        host memory), failed with the reason: the caller ends it, and asks again."""
        pool = self.scheduler.pool
        if pool is None:
            return []
        decoding = self.scheduler.num_decoding
        self._evict_idle_until(decoding + min(self.scheduler.cells_promised(), self.scheduler.planner.step_tokens))
        while pool.num_free < decoding:
            victims = sorted(self.scheduler.running, key=lambda seq: (seq.priority, -(seq.admitted_at or 0.0)))
            if len(victims) <= 1:
                break  # one sequence alone always fits: its cap is at most the pool
            victim = victims[0]
            if victim.status is SequenceStatus.PREFILLING:
                self._requeue(victim, now)
                continue
            slot = victim.slot
            if not self._park(victim, now, "the KV pool is full"):
                victim.fail(f"the KV pool ({pool.size} tokens) is full and host memory (--cache-ram) has no room "
                            f"to park this request's {victim.n_past} tokens: give a larger -c or --cache-ram")
                return [victim]
            self.scheduler.forget_kept(slot)  # its cells leave the pool: the parked copy serves
            self.backend.reuse_prefix(slot, slot, 0)
            decoding -= 1
        return []

    def _requeue(self, seq: Sequence, now: float) -> None:
        """A sequence still prefilling leaves the pool and waits again; what it computed goes
        to host memory when worth it (its prompt starts from there when it comes back)."""
        slot = seq.slot
        computed = self.scheduler.requeue(seq, now)
        logger.info("the KV pool is full: %s waits again after %d prompt tokens", seq.id, len(computed))
        self._evict_idle(IdleEviction(slot, computed))

    def _park(self, seq: Sequence, now: float, why: str) -> bool:
        """Preempt a decoding sequence: its KV parked in host memory, it waits again and
        resumes exactly where it stopped (its slot keeps the KV as a prefix meanwhile). False
        when it cannot be parked (then it stays as it is)."""
        if not seq.can_be_preempted or self.scheduler.host_cache is None:
            return False
        state = self.backend.save_slot(seq.slot)
        parked = None if state is None else self.host_cache.park(reusable_kv_tokens(seq, with_generated=True), state)
        if parked is None:
            return False
        logger.info("%s: preempting %s (priority %d) after %d tokens", why, seq.id, seq.priority,
                    len(seq.output_tokens))
        self.scheduler.preempt(seq, parked, now)
        self.stats.note_preemption()
        return True

    def _evict_idle_until(self, num_free: int) -> None:
        """In a shared pool, free slots' kept prefixes leave, least recently used first, until
        num_free cells are free (or none is left to go)."""
        for slot in self.scheduler.idle_by_age():
            if self.scheduler.pool.num_free >= num_free:
                break
            self._evict_idle(self.scheduler.evict_kept(slot))

    def _evict_idle(self, idle: IdleEviction) -> None:
        """A free slot's kept prefix leaves the pool: saved to host memory first when worth it."""
        if len(idle.tokens) >= MIN_SAVE_TOKENS:
            self._save_to_host(idle.slot, idle.tokens, idle.scores)
        self.backend.reuse_prefix(idle.slot, idle.slot, 0)
        self.stats.note_pool_eviction()

    def release(self, seq: Sequence, slot: int | None, now: float) -> None:
        """A sequence that ended leaves its slot or the queue: its parked KV is dropped, and
        its slot's KV stays as a prefix others may reuse (or is cleared: after a failure the
        KV is in doubt, and nothing of it is kept)."""
        if seq.parked is not None:  # preempted, then cancelled (or failed) while it waited
            self.host_cache.unpark(seq.parked)
        # (an embedding's KV is no one's prefix: a chat seldom starts with a document, and another
        # embedding needs every token's row)
        keeps = seq.status is not SequenceStatus.FAILED and seq.embedding is None
        num_kept = self.scheduler.release(seq, keeps, now)
        if slot is not None and not self.backend.reuse_prefix(slot, slot, num_kept):
            self.scheduler.forget_kept(slot)  # not intact: the backend cleared it, keep nothing

    def shift_full_windows(self) -> list[Sequence]:
        """Slide every decoding sequence whose window is full; the ones that cannot slide (the
        caller ends them)."""
        shifts, stuck = self.scheduler.shifts_needed()
        if not self.backend.can_shift:
            stuck += [shift.seq for shift in shifts]
            shifts = []
        for shift in shifts:
            self.backend.shift_slot(shift.seq.slot, shift.keep, shift.discard, shift.seq.n_past)
            shift.seq.record_shift(shift.keep, shift.discard)
        for seq in stuck:
            seq.exhaust_window()
        return stuck

    def holding(self, prompt: np.ndarray, share_more_than: int | None = None) -> PrefixHolding:
        """How much of `prompt` a slot or host memory holds here, and how much a prefill under
        way will hold; with share_more_than, also the KV of the longest held prefix when it is
        longer than that (the host memory's state, or the slot's, saved now)."""
        slot, in_slot, in_flight = self.scheduler.longest_held(prompt)
        entry, in_host = self.host_cache.best_match(prompt)  # none held when host memory is off
        held = max(in_slot, in_host)
        if share_more_than is None or held <= share_more_than:
            return PrefixHolding(held, in_flight)
        state = self.host_cache.state_of(entry) if entry is not None and in_host >= in_slot else None
        if state is not None:
            return PrefixHolding(held, in_flight, SharedPrefix(entry.tokens, state))
        state = self.backend.save_slot(slot)
        shared = None if state is None else SharedPrefix(self.scheduler.kv_tokens(slot), state)
        return PrefixHolding(held, in_flight, shared)

    def persist(self) -> None:
        """Before the engine closes: what host memory and the free slots keep, written to the
        disk tier (where it is on), to be found again after a restart."""
        if self.host_cache.disk is None:
            return
        kept = []
        for slot in self.scheduler.idle_by_age():
            tokens = self.scheduler.kv_tokens(slot)
            state = self.backend.save_slot(slot) if len(tokens) >= MIN_SAVE_TOKENS else None
            if state is not None:
                kept.append((tokens, state))
        self.host_cache.persist(kept)

    # --- llama-server's slot actions (POST /slots/{id}): on an idle slot; None when it is busy --

    def saved_slot(self, slot: int) -> tuple[np.ndarray, SlotState | None] | None:
        """The tokens an idle slot's KV keeps, and its state (None: it keeps nothing)."""
        if not self.scheduler.slots[slot].is_free:
            return None
        tokens = self.scheduler.kv_tokens(slot)
        return tokens, self.backend.save_slot(slot) if len(tokens) else None

    def restore_slot(self, slot: int, tokens: np.ndarray, state: SlotState, now: float) -> bool | None:
        """An idle slot given a saved state (what it kept goes to host memory first, when worth
        it); its KV then keeps `tokens`. False when the state does not restore here."""
        if not self.scheduler.slots[slot].is_free:
            return None
        self.erase_slot(slot, save=True)
        if self.scheduler.pool is not None:
            self._evict_idle_until(len(tokens))
        if not self.backend.restore_slot(slot, state, len(tokens)):
            self.backend.reuse_prefix(slot, slot, 0)
            return False
        self.scheduler.slots[slot].keep(np.asarray(tokens, dtype=np.int64), now)
        return True

    def erase_slot(self, slot: int, save: bool = False) -> int | None:
        """An idle slot's kept prefix dropped (with `save`, to host memory first when worth it);
        how many tokens it kept."""
        if not self.scheduler.slots[slot].is_free:
            return None
        idle = self.scheduler.evict_kept(slot)
        if save and len(idle.tokens) >= MIN_SAVE_TOKENS:
            self._save_to_host(slot, idle.tokens, idle.scores)
        self.backend.reuse_prefix(slot, slot, 0)
        return len(idle.tokens)

    def clear(self) -> None:
        """Forget every prefix kept in a free slot (and clear that slot's KV) or in host memory."""
        for slot in self.scheduler.forget_prefixes():
            self.backend.reuse_prefix(slot, slot, 0)
        self.host_cache.clear()

    def _resume(self, seq: Sequence, placement: Placement) -> None:
        """A preempted sequence back in a slot: its parked KV restored (or still there)."""
        parked = placement.host_entry
        if placement.source_slot == placement.slot:
            intact = self.backend.reuse_prefix(placement.slot, placement.slot, placement.num_cached)
        else:
            intact = self.backend.restore_slot(placement.slot, parked.state, placement.num_cached)
        self.host_cache.unpark(parked)
        if not intact:
            seq.fail("internal error: the KV of a preempted request could not be restored")

    def _place_prefix(self, placement: Placement) -> bool:
        entry = placement.host_entry
        if entry is None:
            return self.backend.reuse_prefix(placement.slot, placement.source_slot, placement.num_cached)
        started = time.perf_counter()
        state = self.host_cache.state_of(entry)  # read from the disk tier first, where it is there alone
        intact = state is not None and self.backend.restore_slot(placement.slot, state, placement.num_cached)
        if intact:
            self.host_cache.note_restored(entry, placement.num_cached, time.perf_counter() - started)
        return intact

    def _save_what_is_lost(self, admission: Admission) -> None:
        """Before a slot's KV is overwritten, keep it in host memory, under its tokens."""
        if admission.num_tokens_lost >= MIN_SAVE_TOKENS:
            self._save_to_host(admission.placement.slot, admission.evicted, admission.evicted_scores)

    def _save_to_host(self, slot: int, tokens: np.ndarray, scores: KeptScores | None = None) -> None:
        """Keep the slot's KV in host memory under its tokens (with a scored prompt's log
        probabilities), unless it is off or holds them."""
        cache = self.host_cache
        if cache.is_enabled and not cache.covers(tokens, scored=scores is not None):
            state = self.backend.save_slot(slot)
            if state is not None:
                cache.add(tokens, state, scores)
