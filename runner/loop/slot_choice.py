"""Where a waiting sequence goes: the slot it takes and the prefix it starts from, found in a
slot's KV or in a state saved to host memory (`SlotChooser`, the scheduler's admission rules).

Pure Python over the scheduler's slots (their holders and kept prefixes) and queue, which it reads
and never changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..llama.batch import ChunkRules
from ..kv.hostcache import HostCache, HostEntry
from ..kv.prefix import MIN_COPY_TOKENS, KeptScores, common_prefix_length, worth_waiting_for
from .sequence import Sequence, SequenceStatus, reusable_prompt_length, scores_prompt
from .slot import Slot, least_recently_used
from .waiting import WaitingQueue


@dataclass(frozen=True)
class Placement:
    """Where an admitted prompt goes: its slot, and the prefix it starts from, found in
    `source_slot`'s KV (the slot itself when nothing needs copying), or in a state saved to
    host memory (`host_entry`; source_slot None). A preempted sequence's placement always
    names its parked state, and source_slot is its slot when that still holds it."""

    slot: int
    source_slot: int | None
    num_cached: int
    host_entry: HostEntry | None = None
    prompt_scores: tuple = ()  # a scored prompt's: the log probabilities its reused prefix brings


@dataclass(frozen=True)
class IdleEviction:
    """A free slot whose kept prefix goes, to make room in a shared KV pool."""

    slot: int
    tokens: np.ndarray  # what its KV held
    scores: KeptScores | None = None  # a scored prompt's log probabilities, kept with them


def _first_scores(kept: KeptScores, length: int, num_top: int) -> tuple:
    """The log probabilities of a kept scored prefix's first `length` tokens after the first,
    with num_top alternatives each."""
    scores = kept.logprobs[:length]
    if num_top < kept.num_top:
        scores = tuple(dataclasses.replace(entry, top_logprobs=entry.top_logprobs[:num_top]) for entry in scores)
    return scores


class SlotChooser:
    """The slot and the starting prefix of each sequence admitted: the longest prefix of its
    prompt that some slot's KV holds (copied when it is worth it), or host memory holds (when
    restoring it costs less than computing what it adds); or none yet, when a prompt being
    prefilled will hold more. Reads the scheduler's slots, kept prefixes and waiting queue."""

    def __init__(self, slots: list[Slot], waiting: WaitingQueue, chunk_rules: ChunkRules, prefix_cache: bool,
                 host_cache: HostCache | None) -> None:
        self.slots = slots  # the scheduler's own
        self.waiting = waiting
        self.chunk_rules = chunk_rules
        self.prefix_cache = prefix_cache
        self.host_cache = host_cache

    def place_parked(self, seq: Sequence, free: list[int], copy_sources: set[int]) -> Placement:
        """A preempted sequence's slot: one that still holds its KV (nothing to restore), else
        the least recently used, where its parked KV is restored."""
        tokens = seq.parked.tokens
        for slot in free:
            if np.array_equal(self.slots[slot].kept, tokens):
                return Placement(slot, slot, len(tokens), seq.parked)
        targets = [slot for slot in free if slot not in copy_sources] or free
        return Placement(self._least_recently_used(targets), None, len(tokens), seq.parked)

    def place(self, seq: Sequence, free: list[int], copy_sources: set[int]) -> Placement | None:
        """The slot for seq and the prefix it reuses; None to wait for one being prefilled."""
        if not self.prefix_cache:
            return Placement(free[0], free[0], 0)
        if seq.embedding is not None:  # every token's row is needed: nothing is reused
            slot = self._least_recently_used([slot for slot in free if slot not in copy_sources] or free)
            return Placement(slot, slot, 0)
        if scores_prompt(seq):
            return self._place_scored(seq, free, copy_sources)
        prompt = seq.prompt_array
        resident, in_flight = self.prefixes_for(prompt)
        best = max(range(len(self.slots)), key=resident.__getitem__)
        if worth_waiting_for(in_flight, resident[best]):
            return None
        own = max(free, key=lambda slot: (resident[slot], -self.slots[slot].last_used))
        oldest = self._least_recently_used(free)  # an empty slot, else the LRU prefix to evict
        if resident[best] >= resident[own] + MIN_COPY_TOKENS:
            placement = Placement(oldest, best, resident[best])
        elif resident[own] >= MIN_COPY_TOKENS:
            placement = Placement(own, own, resident[own])
        else:  # too little in common to be worth evicting another prompt for (a BOS, a template header)
            placement = Placement(oldest, oldest, resident[oldest])
        return self._restored_instead(placement, prompt, [slot for slot in free if slot not in copy_sources])

    def _place_scored(self, seq: Sequence, free: list[int], copy_sources: set[int]) -> Placement | None:
        """A scored prompt reuses only a prefix a scored prompt left, with its log probabilities
        (a cache keeps KV, not rows): the longest one in a slot (copied, so that the source
        stays for the prompts behind it, the other choices of one question) or in host memory
        (restored, where that costs less than computing it), or waits for a scored prompt
        being computed that will leave a longer one; else it is computed from nothing."""
        prompt, num_top = seq.prompt_array, seq.params.prompt_logprobs
        best, best_length = None, 0
        for slot in free:
            kept = self.slots[slot].kept_scores
            if kept is None or kept.num_top < num_top:
                continue
            length = self._scored_reusable(common_prefix_length(self.slots[slot].kept, prompt), kept, len(prompt))
            if length > best_length:
                best, best_length = slot, length
        entry, in_host = self.host_cache.best_scored_match(prompt, num_top) if self.host_cache else (None, 0)
        in_host = self._scored_reusable(in_host, entry.scores, len(prompt)) if entry is not None else 0
        if worth_waiting_for(self._scored_in_flight(prompt), max(best_length, in_host)):
            return None
        # Not over another question's scored context, whose other choices may be on their way.
        targets = [slot for slot in free if slot not in copy_sources and slot != best] or free
        unscored = [slot for slot in targets if self.slots[slot].kept_scores is None]
        target = self._least_recently_used(unscored or targets)
        if entry is not None and in_host >= best_length + MIN_COPY_TOKENS and \
                self.host_cache.restoring_pays(entry, in_host - best_length):
            return Placement(target, None, in_host, entry, _first_scores(entry.scores, in_host, num_top))
        if best is None:
            return Placement(target, target, 0)
        return Placement(target, best, best_length,
                         prompt_scores=_first_scores(self.slots[best].kept_scores, best_length, num_top))

    def _scored_reusable(self, common: int, kept: KeptScores, prompt_length: int) -> int:
        """How much of a prompt a scored prefix sharing `common` tokens with it gives: the row
        of the last token reused is gone, so the prompt goes on from the one before it."""
        common = min(common, len(kept.logprobs) + 1)
        return self.chunk_rules.reusable(common - 1, prompt_length) if common > 1 else 0

    def _scored_in_flight(self, prompt: np.ndarray) -> int:
        """The longest prefix of `prompt` that a scored prompt in a slot will leave with its
        log probabilities (one still being computed, or one token from the end)."""
        longest = 0
        for holder in (slot.holder for slot in self.slots):
            if holder is not None and scores_prompt(holder) and holder.max_tokens - len(holder.output_tokens) <= 1:
                longest = max(longest, common_prefix_length(holder.prompt_array, prompt) - 1)
        return longest

    def prefixes_for(self, prompt: np.ndarray) -> tuple[list[int], int]:
        """How much of the prompt each slot's KV holds (reusable by the chunk rules), and the
        most that a prompt still being prefilled will hold."""
        reusable = self.chunk_rules.reusable
        resident = [0] * len(self.slots)
        in_flight = 0
        for slot, holder in enumerate(slot.holder for slot in self.slots):
            if holder is None:
                resident[slot] = reusable(common_prefix_length(self.slots[slot].kept, prompt), len(prompt))
                continue
            shared = common_prefix_length(holder.prompt_array, prompt)
            resident[slot] = reusable(min(shared, reusable_prompt_length(holder)), len(prompt))
            if holder.status is SequenceStatus.PREFILLING:
                in_flight = max(in_flight, reusable(shared, len(prompt)))
        return resident, in_flight

    def longest_held(self, prompt: np.ndarray) -> tuple[int, int, int]:
        """The slot whose KV holds the longest reusable prefix of `prompt`, that prefix's
        length, and the most that a prompt still being prefilled, or waiting to be, will hold."""
        resident, in_flight = self.prefixes_for(prompt)
        reusable = self.chunk_rules.reusable
        for seq in self.waiting:
            in_flight = max(in_flight, reusable(common_prefix_length(seq.prompt_array, prompt), len(prompt)))
        slot = max(range(len(self.slots)), key=resident.__getitem__)
        return slot, resident[slot], in_flight

    def waits_for_prefill(self, seq: Sequence) -> bool:
        """Whether admission would hold seq back for a prefix another slot is prefilling."""
        if not self.prefix_cache or seq.parked is not None or scores_prompt(seq):
            return False
        resident, in_flight = self.prefixes_for(seq.prompt_array)
        return worth_waiting_for(in_flight, max(resident))

    def _restored_instead(self, placement: Placement, prompt: np.ndarray, targets: list[int]) -> Placement:
        """A placement that restores a saved state from host memory, where one holds a longer
        prefix than any slot and restoring it costs less than computing what it adds."""
        if self.host_cache is None or not targets:
            return placement
        entry, shared = self.host_cache.best_match(prompt)
        num_cached = self.chunk_rules.reusable(shared, len(prompt))
        gain = num_cached - placement.num_cached
        if entry is None or gain < MIN_COPY_TOKENS or not self.host_cache.restoring_pays(entry, gain):
            return placement
        return Placement(self._least_recently_used(targets), None, num_cached, entry)

    def _least_recently_used(self, indices: list[int]) -> int:
        return least_recently_used(self.slots[index] for index in indices).index
