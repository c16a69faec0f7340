"""The scheduler: who waits, who holds which slot, and what goes into the next batch.

Pure Python over Sequence objects; it never touches the model. It moves sequences between
the waiting queue and the slots (their own state changes through Sequence's methods) and
plans each step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from .batch import BatchEntry
from .config import OverflowPolicy
from .sequence import Sequence, SequenceStatus


class PromptDoesNotFit(ValueError):
    """A prompt that cannot be placed in its slot's window under its overflow policy."""


@dataclass(frozen=True)
class PromptFit:
    tokens: list[int]
    num_dropped: int


def fit_prompt(tokens: list[int], window: int, n_keep: int, max_tokens: int, policy: OverflowPolicy) -> PromptFit:
    """Fit a prompt into a slot's window, leaving room to generate.

    A prompt that fits (at least one free position after it) is kept whole. Otherwise, with
    `slide`, the first n_keep tokens and the newest tail are kept and the middle dropped, so
    that min(max_tokens, window / 2) positions stay free for generation; with `reject` it is
    an error naming both sizes.
    """
    if len(tokens) < window:
        return PromptFit(list(tokens), 0)
    if policy is OverflowPolicy.REJECT:
        raise PromptDoesNotFit(
            f"prompt has {len(tokens)} tokens but the slot window is {window} tokens "
            f"(overflow policy 'reject'; use 'slide' to keep its start and end)")
    room_to_generate = max(1, min(max_tokens, window // 2))
    tail_length = window - room_to_generate - n_keep
    if tail_length < 1:
        raise PromptDoesNotFit(
            f"prompt has {len(tokens)} tokens and n_keep={n_keep} leaves no room in a {window}-token slot window")
    kept = tokens[:n_keep] + tokens[len(tokens) - tail_length:]
    return PromptFit(kept, len(tokens) - len(kept))


@dataclass(frozen=True, slots=True)
class Chunk:
    """One sequence's part of a step: the batch entry, and whether it is prompt tokens
    (rather than the sequence's newest generated token)."""

    seq: Sequence
    entry: BatchEntry
    is_prefill: bool

    @property
    def num_tokens(self) -> int:
        return len(self.entry.tokens)


@dataclass(frozen=True)
class StepPlan:
    """One llama_decode call: chunks ordered by slot, at most one per slot.

    Ordering by slot matters: with one KV stream per slot, llama.cpp groups sequences into a
    micro-batch only while their ids are consecutive in batch order."""

    chunks: list[Chunk]

    @property
    def entries(self) -> list[BatchEntry]:
        return [chunk.entry for chunk in self.chunks]

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for chunk in self.chunks if not chunk.is_prefill)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks if chunk.is_prefill)

    @property
    def output_seqs(self) -> list[Sequence]:
        """Sequences that get a logits row, in row order."""
        return [chunk.seq for chunk in self.chunks if chunk.entry.wants_output]

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def with_halved_prefill(self) -> StepPlan | None:
        """The same step with every prompt chunk halved, for a retry when the KV had no room;
        None when no chunk can shrink any more."""
        if all(chunk.num_tokens <= 1 or not chunk.is_prefill for chunk in self.chunks):
            return None
        chunks = []
        for chunk in self.chunks:
            if chunk.is_prefill and chunk.num_tokens > 1:
                entry = chunk.entry
                half = BatchEntry(entry.slot, entry.tokens[: len(entry.tokens) // 2], entry.start_pos, False)
                chunk = Chunk(chunk.seq, half, True)
            chunks.append(chunk)
        return StepPlan(chunks)


@dataclass(frozen=True)
class Shift:
    """A generation shift of one slot: keep `keep` positions, drop the next `discard`."""

    seq: Sequence
    keep: int
    discard: int


class Scheduler:
    def __init__(self, num_slots: int, max_batch_tokens: int, window: int, n_discard: int = 0) -> None:
        assert max_batch_tokens >= num_slots, "every slot must be able to decode each step"
        self.num_slots = num_slots
        self.max_batch_tokens = max_batch_tokens
        self.window = window
        self.n_discard = n_discard  # 0: half of what follows n_keep, as llama.cpp does
        self.waiting: deque[Sequence] = deque()
        self.slots: list[Sequence | None] = [None] * num_slots

    # --- queries -------------------------------------------------------------------------

    @property
    def running(self) -> list[Sequence]:
        return [seq for seq in self.slots if seq is not None]

    @property
    def num_free_slots(self) -> int:
        return sum(1 for seq in self.slots if seq is None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(seq is not None for seq in self.slots)

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

    def admit(self, now: float) -> list[Sequence]:
        """Give free slots to waiting sequences, lowest slot first, in arrival order."""
        admitted = []
        for slot, holder in enumerate(self.slots):
            if holder is None and self.waiting:
                seq = self.waiting.popleft()
                seq.admit(slot, now)
                self.slots[slot] = seq
                admitted.append(seq)
        return admitted

    def release(self, seq: Sequence) -> None:
        """Take a finished sequence out of its slot or out of the queue."""
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def drain_waiting(self) -> list[Sequence]:
        """Take every waiting sequence out of the queue (for cancel_all)."""
        drained = list(self.waiting)
        self.waiting.clear()
        return drained

    # --- the step ------------------------------------------------------------------------

    def plan(self) -> StepPlan:
        """One token for every decoding sequence, then prompt chunks in arrival order, up to
        max_batch_tokens in all."""
        chunks: dict[int, Chunk] = {}
        for seq in self.running:
            if seq.status is SequenceStatus.DECODING:
                chunks[seq.slot] = Chunk(seq, BatchEntry(seq.slot, [seq.last_token], seq.n_past, True), False)
        budget = self.max_batch_tokens - len(chunks)
        for seq in self._prefilling_in_arrival_order():
            if budget <= 0:
                break
            length = min(seq.num_prompt_remaining, budget)
            start = seq.num_prefilled
            tokens = seq.prompt_tokens[start:start + length]
            is_last = start + length == len(seq.prompt_tokens)
            chunks[seq.slot] = Chunk(seq, BatchEntry(seq.slot, tokens, seq.n_past, is_last), True)
            budget -= length
        return StepPlan([chunks[slot] for slot in sorted(chunks)])

    def _prefilling_in_arrival_order(self) -> list[Sequence]:
        prefilling = [seq for seq in self.running if seq.status is SequenceStatus.PREFILLING]
        return sorted(prefilling, key=lambda seq: seq.admitted_at)

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
        keep = min(seq.n_keep, seq.n_past)
        movable = seq.n_past - keep
        if movable < 2:
            return None
        discard = self.n_discard or movable // 2
        return Shift(seq, keep, min(discard, movable - 1))
