"""The scheduler: who waits, who holds which slot, and what goes into the next batch.

Pure Python over Sequence objects; it never touches the model. It moves sequences between
the waiting queue and the slots (multiseq.loop.slot: a slot's holder, or the prefix it keeps;
a sequence's own state changes through Sequence's methods), and
hands the running ones to its StepPlanner (multiseq.loop.planning) to plan each step; where each
admitted sequence goes, and the prefix it starts from, its SlotChooser (multiseq.loop.slot_choice) says.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from ..llama.batch import ChunkRules
from ..config import OverflowPolicy
from ..kv.hostcache import HostCache, HostEntry
from ..kv.pool import CellLedger
from .planning import StepPlan, StepPlanner
from ..kv.prefix import KeptScores
from .sequence import Sequence, SequenceStatus, reusable_kv_tokens, scores_prompt
from .slot import Slot
from .slot_choice import IdleEviction, Placement, SlotChooser
from .waiting import WaitingQueue

# How far into the queue admission looks for a request that can start now, when the ones
# before it wait for a prefix being prefilled (bounded: the queue may hold thousands).
_LOOKAHEAD_PER_SLOT = 4
# In a shared KV pool, a request is admitted when its prompt's new cells and room for this many
# generated tokens (fewer when it asks for fewer) are free: the decoding sequences grow a cell
# each per step, and admitting what would be preempted a few steps later only moves KV around.
GROWTH_RESERVE_TOKENS = 256


_NONE = np.zeros(0, dtype=np.int64)


class PromptDoesNotFit(ValueError):
    """A prompt that cannot be placed in its slot's window under its overflow policy."""

    def __init__(self, message: str, num_prompt: int) -> None:
        super().__init__(message)
        self.num_prompt = num_prompt  # the prompt's tokens, which clients may be told


@dataclass(frozen=True)
class PromptFit:
    tokens: list[int]
    num_dropped: int
    max_tokens: int  # what the request may generate: as asked, or (None) what the window leaves


def fit_prompt(tokens: list[int], window: int, n_keep: int, max_tokens: int | None,
               policy: OverflowPolicy) -> PromptFit:
    """Fit a prompt into a slot's window, leaving room to generate.

    A prompt that fits (at least one free position after it) is kept whole. Otherwise, with
    `slide`, the first n_keep tokens and the newest tail are kept and the middle dropped, so
    that min(max_tokens, window / 2) positions stay free for generation; with `reject` it is
    an error naming the sizes. A max_tokens beyond what the window leaves after a prompt that
    fits is capped to it (generation ends there, finish_reason length), as llama-server does:
    agents ask for more tokens than a small model's window holds (Claude Code 32,000), and the
    prompt itself loses nothing. max_tokens None asks for whatever the window leaves.
    """
    if policy is OverflowPolicy.REJECT:
        _check_prompt_fits(len(tokens), window)
        max_tokens = window - len(tokens) if max_tokens is None else min(max_tokens, window - len(tokens))
    if len(tokens) < window:
        return PromptFit(list(tokens), 0, max_tokens if max_tokens is not None else window - len(tokens))
    room_to_generate = max(1, min(max_tokens or window, window // 2))
    tail_length = window - room_to_generate - n_keep
    if tail_length < 1:
        raise PromptDoesNotFit(
            f"prompt has {len(tokens)} tokens and n_keep={n_keep} leaves no room in a {window}-token slot window",
            len(tokens))
    kept = tokens[:n_keep] + tokens[len(tokens) - tail_length:]
    return PromptFit(kept, len(tokens) - len(kept), max_tokens if max_tokens is not None else room_to_generate)


def _check_prompt_fits(num_prompt: int, window: int) -> None:
    """Under `reject`: the prompt, and at least one token to generate, must fit in the window."""
    if num_prompt >= window:
        raise PromptDoesNotFit(
            f"the prompt has {num_prompt} tokens, but a slot's context window is {window} tokens "
            f"(overflow policy 'reject'): shorten the conversation, or serve with a larger --slot-ctx", num_prompt)


@dataclass(frozen=True)
class Admission:
    """A sequence given a slot, the prefix it starts from, and what the slot held before;
    in a shared KV pool, the other free slots whose kept prefixes must go first for room."""

    seq: Sequence
    placement: Placement
    evicted: np.ndarray  # the tokens the slot's KV held until now (its last request's)
    idle_evictions: tuple[IdleEviction, ...] = ()
    evicted_scores: KeptScores | None = None  # and their log probabilities, a scored prompt's
    resumes: bool = False  # a preempted sequence, its parked KV restored: it goes on decoding

    @property
    def num_tokens_lost(self) -> int:
        """Of the slot's old tokens, how many the new sequence does not keep in place."""
        kept = self.placement.num_cached if self.placement.source_slot == self.placement.slot else 0
        return len(self.evicted) - min(kept, len(self.evicted))


@dataclass(frozen=True)
class Shift:
    """A generation shift of one slot: keep `keep` positions, drop the next `discard`."""

    seq: Sequence
    keep: int
    discard: int


class Scheduler:
    """The waiting queue and the slots: admission (by priority, then age), preemption, release,
    and each step's plan and shifts. Used by the engine on its own thread."""

    def __init__(self, num_slots: int, max_batch_tokens: int, window: int, n_discard: int = 0,
                 prefix_cache: bool = True, chunk_rules: ChunkRules = ChunkRules(),
                 isolate_prefill: bool = False, host_cache: HostCache | None = None,
                 step_tokens: int | None = None, pool: CellLedger | None = None) -> None:
        self.num_slots = num_slots
        self.planner = StepPlanner(num_slots, max_batch_tokens, step_tokens, chunk_rules, isolate_prefill)
        self.window = window
        self.n_discard = n_discard  # 0: half of what follows n_keep, as llama.cpp does
        self.prefix_cache = prefix_cache
        self.chunk_rules = chunk_rules
        # A free slot keeps its last request's prompt and generated tokens for reuse; where
        # reuse must be exact, only the prompt: generated tokens were computed a row at a time,
        # which rounds differently from the same tokens computed as a prompt.
        self.keeps_generated = not chunk_rules.exact_reuse
        self.host_cache = host_cache if host_cache is not None and host_cache.is_enabled and prefix_cache else None
        self.waiting = WaitingQueue()
        self.slots = [Slot(index) for index in range(num_slots)]  # each: its holder, or the prefix it keeps
        self.pool = pool  # the cells of a KV pool the slots share; None: a window each
        self.chooser = SlotChooser(self.slots, self.waiting, chunk_rules, prefix_cache, self.host_cache)

    # --- queries -------------------------------------------------------------------------

    @property
    def running(self) -> list[Sequence]:
        return [slot.holder for slot in self.slots if slot.holder is not None]

    @property
    def num_free_slots(self) -> int:
        return sum(1 for slot in self.slots if slot.is_free)

    @property
    def num_decoding(self) -> int:
        return sum(1 for seq in self.running if seq.status is SequenceStatus.DECODING)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or not all(slot.is_free for slot in self.slots)

    def find(self, request_id: str) -> Sequence | None:
        for seq in self._all():
            if seq.id == request_id:
                return seq
        return None

    def _all(self) -> Iterator[Sequence]:
        yield from self.running
        yield from self.waiting

    # --- moving sequences ----------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING
        self.waiting.append(seq)

    def admit(self, now: float) -> list[Admission]:
        """Give free slots to waiting sequences by priority, then age (see WaitingQueue), each
        starting from the longest prefix of its prompt that some slot's KV holds. A sequence
        whose prefix is still being prefilled in another slot waits for it; the ones behind it
        may go first. A preempted sequence resumes from its parked KV."""
        admitted = []
        # A copy between slots lands at the next decode, a restore from host memory at once:
        # a slot copied from this round must not be overwritten by a restore in the same round.
        copy_sources: set[int] = set()
        room = _PoolRoom(self) if self.pool is not None else None
        for seq in self.waiting.in_admission_order(now, _LOOKAHEAD_PER_SLOT * self.num_slots):
            free = [slot.index for slot in self.slots if slot.is_free]
            if not free:
                break
            placement = self.chooser.place_parked(seq, free, copy_sources) if seq.parked is not None else \
                self.chooser.place(seq, free, copy_sources)
            if placement is None:
                continue
            if seq.media and seq.parked is None:
                placement = replace(placement, num_cached=seq.media.reusable(placement.num_cached))
            idle_evictions = ()
            if room is not None:
                idle_evictions = room.make(seq, placement, copy_sources)
                if idle_evictions is None:  # the pool has no room for it yet: nor for the ones behind it
                    break
            resumes = seq.parked is not None
            if resumes:
                seq.resume(placement.slot)
            else:
                seq.admit(placement.slot, now, placement.num_cached, from_host=placement.host_entry is not None,
                          prompt_scores=placement.prompt_scores)
            self.waiting.remove(seq)
            evicted, evicted_scores = self.slots[placement.slot].hold(seq)
            if placement.source_slot not in (None, placement.slot):
                copy_sources.add(placement.source_slot)
            admitted.append(Admission(seq, placement, evicted, idle_evictions, evicted_scores, resumes))
        return admitted

    def idle_by_age(self, keep: set[int] = frozenset()) -> list[int]:
        """Free slots that keep a prefix, least recently used first (but those in `keep`)."""
        idle = [slot for slot in self.slots if slot.is_free and slot.index not in keep and len(slot.kept)]
        return [slot.index for slot in sorted(idle, key=lambda slot: slot.last_used)]

    def cells_promised(self) -> int:
        """Pool cells the running sequences will take for prompt tokens not yet computed."""
        return sum(seq.num_prompt_remaining for seq in self.running if seq.status is SequenceStatus.PREFILLING)

    def preemptions(self, now: float) -> list[Sequence]:
        """Running sequences to preempt now: for each waiting sequence that no free slot will
        take, in admission order, the lowest-priority decoding sequence below it (the most
        recently admitted of those: the least work to set aside), while there is one. None
        without host memory to park them in, or with no waiting priority above a running one
        (so a queue of equals, as in a batch job, costs no prefix search here)."""
        top = self.waiting.highest_priority
        if self.host_cache is None or top is None or not any(
                running.priority < top and running.can_be_preempted for running in self.running):
            return []
        free = self.num_free_slots
        victims: list[Sequence] = []
        for seq in self.waiting.in_admission_order(now, self.num_slots):
            if self.chooser.waits_for_prefill(seq):  # a slot freed for it would go to another
                continue
            if free > 0:
                free -= 1
                continue
            below = [running for running in self.running
                     if running.priority < seq.priority and running.can_be_preempted and running not in victims]
            if not below:
                continue
            victims.append(min(below, key=lambda running: (running.priority, -running.admitted_at)))
        return victims

    def preempt(self, seq: Sequence, parked: HostEntry, now: float) -> None:
        """Take a decoding sequence out of its slot, back into the queue, its KV parked. The
        slot keeps that KV as a prefix until it is overwritten (then the parked copy serves)."""
        slot = seq.slot
        seq.preempt(parked)
        self.slots[slot].free(parked.tokens, now)
        self.waiting.put_back(seq)

    def requeue(self, seq: Sequence, now: float) -> np.ndarray:
        """Take a prefilling sequence out of its slot, back into the queue (see
        Sequence.requeue); returns the prompt tokens its KV held, which the caller may keep."""
        slot, computed = seq.slot, seq.prompt_array[:seq.num_prefilled]
        seq.requeue()
        self.slots[slot].free(_NONE, now)
        self.waiting.put_back(seq)
        return computed

    def longest_held(self, prompt: np.ndarray) -> tuple[int, int, int]:
        """The slot whose KV holds the longest reusable prefix of `prompt`, that prefix's
        length, and the most that a prompt still being prefilled, or waiting to be, will hold."""
        return self.chooser.longest_held(prompt)

    def kv_tokens(self, slot: int) -> np.ndarray:
        """The tokens the slot's KV holds at their own positions, from position 0 (between
        two steps): a running sequence's, or the prefix a free slot keeps."""
        holder = self.slots[slot].holder
        return self.slots[slot].kept if holder is None else reusable_kv_tokens(holder, self.keeps_generated)

    def release(self, seq: Sequence, keeps_prefix: bool, now: float) -> int:
        """Take a finished sequence out of its slot or out of the queue. Returns how many
        leading positions of its slot's KV stay, as a prefix later prompts may reuse (0: the
        slot's KV must be cleared)."""
        if seq.slot is not None and self.slots[seq.slot].holder is seq:
            kept = reusable_kv_tokens(seq, self.keeps_generated) if self.prefix_cache and keeps_prefix else _NONE
            scores = KeptScores(tuple(seq.prompt_logprobs), seq.params.prompt_logprobs) if scores_prompt(seq) else None
            self.slots[seq.slot].free(kept, now, scores if len(kept) else None)
            return len(kept)
        if seq in self.waiting:
            self.waiting.remove(seq)
        return 0

    def evict_kept(self, slot: int) -> IdleEviction:
        """A free slot's kept prefix given up (its tokens and scores, for host memory to keep)."""
        return IdleEviction(slot, *self.slots[slot].give_up_kept())

    def forget_kept(self, slot: int) -> None:
        """The slot keeps nothing any more (its KV was cleared, or its cells left the pool)."""
        self.slots[slot].give_up_kept()

    def forget_prefixes(self) -> list[int]:
        """Drop every kept prefix; returns the free slots whose KV must be cleared."""
        slots = [slot for slot in self.slots if slot.is_free and len(slot.kept)]
        for slot in slots:
            slot.give_up_kept()
        return [slot.index for slot in slots]

    def drain_waiting(self) -> list[Sequence]:
        """Take every waiting sequence out of the queue (for cancel_all)."""
        return self.waiting.clear()

    # --- the step ------------------------------------------------------------------------

    def plan(self) -> StepPlan:
        """The next step's batch, from the running sequences (see StepPlanner.plan)."""
        return self.planner.plan(self.running, self.pool.num_free if self.pool is not None else None)

    def shifts_needed(self) -> tuple[list[Shift], list[Sequence]]:
        """Decoding sequences whose window is full: the shift each needs, and those that
        cannot shift at all (nothing left to discard after n_keep)."""
        shifts, stuck = [], []
        for seq in self.running:
            if seq.status is SequenceStatus.DECODING and seq.n_past >= self.window:
                shift = self._shift_for(seq)
                if shift is None:
                    stuck.append(seq)
                else:
                    shifts.append(shift)
        return shifts, stuck

    def _shift_for(self, seq: Sequence) -> Shift | None:
        # In a shared pool, the cells another slot holds too stay where they are (llama.cpp
        # keeps one position per cell): they are kept as if they were n_keep tokens.
        shared = self.pool.shared_extent(seq.slot) if self.pool is not None else 0
        keep = min(max(seq.n_keep, shared), seq.n_past)
        movable = seq.n_past - keep
        if movable < 2:
            return None
        discard = self.n_discard or movable // 2
        return Shift(seq, keep, min(discard, movable - 1))


class _PoolRoom:
    """Cells of a shared KV pool during one admission round: what is free (less what the
    prompts being prefilled will take), and the kept prefixes of free slots that may go for
    room, least recently used first."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.pool = scheduler.pool
        self.free = self.pool.num_free - scheduler.cells_promised() - scheduler.num_decoding
        self.taken: set[int] = set()  # slots given, or evicted, this round

    def make(self, seq: Sequence, placement: Placement, copy_sources: set[int]) -> tuple[IdleEviction, ...] | None:
        """Room for seq in its placement: the idle prefixes to evict for it (maybe none), or
        None when even all of them would not make enough."""
        reserve = min(GROWTH_RESERVE_TOKENS, max(1, seq.max_tokens - len(seq.output_tokens)))
        keeps_in_place = placement.source_slot == placement.slot
        if seq.parked is not None:
            needed = 0 if keeps_in_place else len(seq.parked.tokens)
        else:
            needed = len(seq.prompt_tokens) - placement.num_cached
        needed += reserve
        slot_frees = max(0, self.pool.only_in(placement.slot) - (placement.num_cached if keeps_in_place else 0))
        available = self.free + (slot_frees if placement.slot not in self.taken else 0)
        protected = copy_sources | self.taken | {placement.slot, placement.source_slot}
        evictions = []
        for slot in self.scheduler.idle_by_age(protected):
            if available >= needed:
                break
            available += self.pool.only_in(slot)
            evictions.append(slot)
        if available < needed:
            return None
        self.free = available - needed
        self.taken.update(evictions, {placement.slot})
        return tuple(self.scheduler.evict_kept(slot) for slot in evictions)
