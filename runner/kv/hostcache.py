"""The host-RAM tier of the prefix cache: slots' KV saved to memory before it is overwritten.

A free slot keeps the KV of its last request (prompt and generated tokens), so that the next
turn of that conversation, or another prompt with the same start, reuses it. With more live
conversations than slots, a slot's KV is overwritten for another request; before that, its
state (llama.cpp's llama_state_seq_get_data) is saved here, under the tokens it holds. A
request whose prompt starts with an entry's tokens has that state restored into its slot
(set_data, then cut back to the shared prefix) instead of prefilling it, when restoring is
cheaper than computing: both costs are measured as the runner goes.

A sequence preempted for a request of higher priority parks its slot's KV here too: a parked
state belongs to its sequence, is never evicted, and counts against the same bound until the
sequence resumes. Entries are bounded in bytes and evicted least recently used first. An entry whose tokens are
a prefix of a newer one is dropped (the newer one covers it), and a state whose tokens an
entry already covers is not saved twice. Pure Python: the backend does the saving and
restoring; this is the index, the memory bound and the cost model.

A scored prompt's state (echo with logprobs) is kept with its log probabilities: the other
choices of a multiple-choice question that come after its context left the slots take both
from here (best_scored_match), and only those entries serve them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..llama.batch import SlotState
from .disk import DiskEntry, DiskTier
from .prefix import KeptScores, common_prefix_length, starts_with, worth_waiting_for

# Saving costs a copy of the slot's KV (~23 kB a token on SmolLM2, 9 on Gemma 3): a slot whose
# loss would cost fewer tokens than this is not worth the memory.
MIN_SAVE_TOKENS = 32
# Starting estimates, replaced by measurements as the runner goes (2-core CPU: a restore of
# 1,201 tokens, 27.7 MB, took 3-8 ms; prefilling them ~3.9 s).
INITIAL_RESTORE_SECONDS_PER_BYTE = 1e-9
INITIAL_PREFILL_SECONDS_PER_TOKEN = 3e-3
INITIAL_DISK_READ_SECONDS_PER_BYTE = 2e-9  # 500 MB/s, until a read is timed
_SMOOTHING = 0.2  # weight of a new measurement in the running estimates


@dataclass(eq=False)
class HostEntry:
    """A slot's KV saved in host memory: the tokens at positions 0..len-1, and the state (None:
    it is still in its file of the disk tier, `disk`, read when it is restored)."""

    tokens: np.ndarray
    state: SlotState | None
    scores: KeptScores | None = None  # a scored prompt's log probabilities of tokens 1, 2, ...
    disk: DiskEntry | None = None

    @property
    def num_bytes(self) -> int:
        return len(self.state) if self.state is not None else self.disk.num_state_bytes


@dataclass(frozen=True)
class SharedPrefix:
    """A prefix's KV as one server hands it to another: a saved slot state and the tokens it
    holds at positions 0..len-1 (the state may hold more: a restore cuts it back)."""

    tokens: np.ndarray
    state: SlotState


@dataclass(frozen=True)
class PrefixHolding:
    """How much of a prompt a server holds (in a slot, or saved in host memory), and how much
    a prefill under way there will hold; with the prefix's KV when it was asked for."""

    num_held: int
    num_in_flight: int = 0
    shared: SharedPrefix | None = None

    @property
    def is_growing(self) -> bool:
        """Whether a prefill under way will hold enough more to be worth waiting for."""
        return worth_waiting_for(self.num_in_flight, self.num_held)


@dataclass
class CostModel:
    """Running estimates of what restoring a byte and prefilling a token cost."""

    restore_seconds_per_byte: float = INITIAL_RESTORE_SECONDS_PER_BYTE
    prefill_seconds_per_token: float = INITIAL_PREFILL_SECONDS_PER_TOKEN
    disk_read_seconds_per_byte: float = INITIAL_DISK_READ_SECONDS_PER_BYTE

    def note_restore(self, num_bytes: int, seconds: float) -> None:
        if num_bytes > 0:
            self.restore_seconds_per_byte = _smoothed(self.restore_seconds_per_byte, seconds / num_bytes)

    def note_prefill(self, num_tokens: int, seconds: float) -> None:
        if num_tokens > 0:
            self.prefill_seconds_per_token = _smoothed(self.prefill_seconds_per_token, seconds / num_tokens)

    def note_disk_read(self, num_bytes: int, seconds: float) -> None:
        if num_bytes > 0:
            self.disk_read_seconds_per_byte = _smoothed(self.disk_read_seconds_per_byte, seconds / num_bytes)

    def restoring_pays(self, num_bytes: int, num_tokens_saved: int, from_disk: bool = False) -> bool:
        """Whether restoring num_bytes (read from disk first) costs less than prefilling the
        tokens it saves."""
        per_byte = self.restore_seconds_per_byte + (self.disk_read_seconds_per_byte if from_disk else 0.0)
        return num_bytes * per_byte < num_tokens_saved * self.prefill_seconds_per_token


def _owned(state: SlotState) -> SlotState:
    """A state this process owns and llama.cpp may be handed: one that came over as a read-only
    view (Ray's object store gives arrays so) is copied, which also frees the store's memory."""
    if isinstance(state, np.ndarray) and not state.flags.writeable:
        return state.copy()
    return state


def _smoothed(estimate: float, measured: float) -> float:
    return (1 - _SMOOTHING) * estimate + _SMOOTHING * measured


@dataclass
class HostCacheStats:
    num_saved: int = 0
    num_restored: int = 0
    num_evicted: int = 0
    tokens_restored: int = 0
    num_imported: int = 0  # states another server handed over (serving on several replicas)


class HostCache:
    """Saved slot states, found by the longest common prefix with a prompt, LRU-bounded in bytes."""

    def __init__(self, limit_bytes: int, disk: DiskTier | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.disk = disk  # where evicted entries go (None: they are dropped)
        self._entries: OrderedDict[int, HostEntry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self.num_bytes = 0  # entries' and parked states'
        self.num_parked_bytes = 0
        self._parked: dict[int, HostEntry] = {}  # by id(): found by prompts too, while parked
        self.costs = CostModel()
        self.stats = HostCacheStats()

    @property
    def is_enabled(self) -> bool:
        return self.limit_bytes > 0 or self.disk is not None

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def _all_states(self) -> list[HostEntry]:
        return [*self._entries.values(), *self._parked.values()]

    def best_match(self, prompt: np.ndarray) -> tuple[HostEntry | None, int]:
        """The entry (or parked state, or file of the disk tier) sharing the longest prefix with
        `prompt`, and that length."""
        best, best_length = None, 0
        for entry in self._all_states():
            length = common_prefix_length(entry.tokens, prompt)
            if length > best_length:
                best, best_length = entry, length
        if self.disk is not None:
            on_disk, length = self.disk.best_match(prompt)
            if length > best_length:
                best, best_length = HostEntry(on_disk.tokens, None, disk=on_disk), length
        return best, best_length

    def restoring_pays(self, entry: HostEntry, num_tokens_saved: int) -> bool:
        """Whether restoring the entry (read from its file first, where it is on disk alone)
        costs less than prefilling the tokens it saves."""
        return self.costs.restoring_pays(entry.num_bytes, num_tokens_saved, from_disk=entry.state is None)

    def state_of(self, entry: HostEntry) -> SlotState | None:
        """The entry's state: read from its file when it is on disk alone, and kept in memory
        from then on (it is the most recently used); None when the file is gone or damaged."""
        if entry.state is not None:
            return entry.state
        started = time.perf_counter()
        state = self.disk.read(entry.disk)
        if state is not None:
            self.costs.note_disk_read(len(state), time.perf_counter() - started)
            entry.state = state
            self._keep(entry.tokens, state, on_disk=True)
        return state

    def best_scored_match(self, prompt: np.ndarray, num_top: int) -> tuple[HostEntry | None, int]:
        """The entry with log probabilities (at least num_top alternatives each) whose tokens
        share the longest prefix with `prompt`, and that length (rows: at most its scores + 1)."""
        best, best_length = None, 0
        for entry in self._entries.values():
            if entry.scores is None or entry.scores.num_top < num_top:
                continue
            length = min(common_prefix_length(entry.tokens, prompt), len(entry.scores.logprobs) + 1)
            if length > best_length:
                best, best_length = entry, length
        return best, best_length

    def covers(self, tokens: np.ndarray, scored: bool = False) -> bool:
        """Whether an entry already holds these tokens (it starts with all of them; with
        `scored`, an entry with log probabilities)."""
        return any(starts_with(entry.tokens, tokens) and (entry.scores is not None or not scored)
                   for entry in self._all_states())

    def add(self, tokens: np.ndarray, state: SlotState, scores: KeptScores | None = None) -> bool:
        """Keep a slot's state under its tokens (and a scored prompt's log probabilities),
        evicting the least recently used entries to make room; False when the state alone is
        larger than the limit."""
        if not self._keep(tokens, state, scores):
            return False
        self.stats.num_saved += 1
        return True

    def _keep(self, tokens: np.ndarray, state: SlotState, scores: KeptScores | None = None,
              on_disk: bool = False) -> bool:
        """add(), counted by its caller (as saved here, or as imported); a state too large for
        memory goes to the disk tier (unless it came from there: `on_disk`)."""
        if len(state) > self.limit_bytes:
            return not on_disk and self._spill(tokens, state)
        for key, entry in list(self._entries.items()):  # entries the new one covers (scores and all)
            if starts_with(tokens, entry.tokens) and (scores is not None or entry.scores is None):
                self._remove(key)
        if not self._make_room(len(state)):
            return False
        self._entries[self._next_key] = HostEntry(np.asarray(tokens, dtype=np.int64), state, scores)
        self._next_key += 1
        self.num_bytes += len(state)
        return True

    def import_shared(self, shared: SharedPrefix) -> bool:
        """Keep a prefix's KV that another server of the same model and settings computed, as
        if this server had saved it; False when it is not kept (host memory is off or too small,
        or an entry already holds those tokens)."""
        if not self.is_enabled or self.covers(shared.tokens) or not self._keep(shared.tokens, _owned(shared.state)):
            return False
        self.stats.num_imported += 1
        return True

    def _make_room(self, num_bytes: int) -> bool:
        """Evict least recently used entries until num_bytes more fit; False if they cannot."""
        if self.num_parked_bytes + num_bytes > self.limit_bytes:
            return False
        while self.num_bytes + num_bytes > self.limit_bytes:
            key = next(iter(self._entries))
            self._spill(self._entries[key].tokens, self._entries[key].state)
            self._remove(key)
            self.stats.num_evicted += 1
        return True

    def _spill(self, tokens: np.ndarray, state: SlotState) -> bool:
        """Hand a state leaving memory to the disk tier, unless it is off or holds it already."""
        return self.disk is not None and not self.disk.covers(tokens) and self.disk.put(tokens, state)

    def persist(self, kept: list[tuple[np.ndarray, SlotState]]) -> None:
        """Before the process ends: every entry, then the slots' `kept` states (the most recent),
        written to the disk tier where it holds them not, and the writes waited for."""
        if self.disk is None:
            return
        for tokens, state in [(entry.tokens, entry.state) for entry in self._entries.values()] + kept:
            if not self.disk.covers(tokens):
                self.disk.put(tokens, state, wait=True)
        self.disk.close()

    def park(self, tokens: np.ndarray, state: SlotState) -> HostEntry | None:
        """Hold a preempted sequence's state (never evicted) until unpark(); None when it
        cannot fit beside the other parked states."""
        if not self._make_room(len(state)):
            return None
        self.num_bytes += len(state)
        self.num_parked_bytes += len(state)
        entry = HostEntry(np.asarray(tokens, dtype=np.int64), state)
        self._parked[id(entry)] = entry
        return entry

    def unpark(self, entry: HostEntry) -> None:
        """The preempted sequence resumed or ended: its parked state's bytes are free again."""
        del self._parked[id(entry)]
        self.num_bytes -= entry.num_bytes
        self.num_parked_bytes -= entry.num_bytes

    def note_restored(self, entry: HostEntry, num_tokens: int, seconds: float) -> None:
        """An entry was restored into a slot: it becomes the most recently used."""
        for key, held in self._entries.items():
            if held is entry:
                self._entries.move_to_end(key)
                break
        self.costs.note_restore(entry.num_bytes, seconds)
        self.stats.num_restored += 1
        self.stats.tokens_restored += num_tokens

    def clear(self) -> None:
        for key in list(self._entries):
            self._remove(key)

    def _remove(self, key: int) -> None:
        self.num_bytes -= self._entries.pop(key).num_bytes
