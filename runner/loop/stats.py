"""Run statistics measured in the scheduler loop, step by step.

llama.cpp's own perf counters file every batch of more than one token as prompt evaluation,
so under continuous batching they cannot tell generation from prefill. The loop knows what
each step holds: a step with any decode token counts as a decode step (the prefill tokens
riding along cost little), a step of prompt tokens only counts as a prefill step.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..kv.hostcache import HostCache
    from .scheduler import Scheduler
    from .sequence import Sequence

# The buckets of one step's wall time, in the order the loop spends it.
STEP_PHASES = ("schedule", "decode", "sample", "postprocess")
# "Throughput now" is measured over this many recent seconds.
RECENT_WINDOW_S = 3.0


@dataclass(frozen=True)
class RunStats:
    """A snapshot of the runner's totals since it started (or since reset)."""

    num_steps: int
    num_decode_steps: int
    generated_tokens: int
    prompt_tokens: int  # prompt tokens computed (decoded); reused ones are not counted here
    wall_s: float  # first submission -> last finished request
    decode_tokens_per_s: float | None  # generated tokens / time of decode steps
    prefill_tokens_per_s: float | None  # None when no step held prompt tokens only
    aggregate_tokens_per_s: float | None  # generated tokens / wall time
    avg_seqs_per_decode_step: float | None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    num_admitted: int = 0
    num_prefix_hits: int = 0  # admitted requests that started from a reused prefix
    prompt_tokens_reused: int = 0  # prompt tokens taken from a prefix already computed (slots or host memory)
    prompt_tokens_restored: int = 0  # of those, the ones restored from host memory
    num_preempted: int = 0  # times a sequence left its slot for one of higher priority (or a full KV pool)
    num_pool_evictions: int = 0  # kept prefixes (idle conversations) moved out of a full KV pool
    draft_tokens: int = 0  # speculative decoding: draft tokens verified
    draft_tokens_accepted: int = 0  # of those, how many came true

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.num_prefix_hits / self.num_admitted if self.num_admitted else None

    @property
    def prompt_reuse_share(self) -> float | None:
        """Of all prompt tokens admitted, the share that was reused rather than computed."""
        total = self.prompt_tokens_reused + self.prompt_tokens
        return self.prompt_tokens_reused / total if total else None

    @property
    def outside_decode_share(self) -> float | None:
        """Share of step time spent outside llama_decode (scheduling, sampling, bookkeeping)."""
        total = sum(self.phase_seconds.values())
        return None if total <= 0 else 1 - self.phase_seconds.get("decode", 0.0) / total


class StatsRecorder:
    """Accumulates per-step measurements; the loop calls record_step once per llama_decode."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.num_steps = 0
        self.num_decode_steps = 0
        self.decode_seconds = 0.0
        self.decode_step_tokens = 0  # generated tokens produced by decode steps
        self.decode_step_seqs = 0
        self.prefill_seconds = 0.0
        self.prefill_step_tokens = 0
        self.generated_tokens = 0
        self.draft_tokens = 0
        self.draft_tokens_accepted = 0
        self.prompt_tokens = 0
        self.first_submit_at: float | None = None
        self.last_finish_at: float | None = None
        self.phase_seconds = dict.fromkeys(STEP_PHASES, 0.0)
        self.num_admitted = 0
        self.num_prefix_hits = 0
        self.prompt_tokens_reused = 0
        self.prompt_tokens_restored = 0
        self.num_preempted = 0
        self.num_pool_evictions = 0
        self.finished_by_reason: Counter[str] = Counter()
        self._recent: deque[tuple[float, int]] = deque()  # (time, generated tokens so far) per step

    def note_submit(self, now: float) -> None:
        if self.first_submit_at is None:
            self.first_submit_at = now

    def note_admission(self, num_cached: int, num_restored: int = 0) -> None:
        self.num_admitted += 1
        self.num_prefix_hits += num_cached > 0
        self.prompt_tokens_reused += num_cached
        self.prompt_tokens_restored += num_restored

    def note_preemption(self) -> None:
        self.num_preempted += 1

    def note_draft(self, num_drafted: int, num_kept: int) -> None:
        self.draft_tokens += num_drafted
        self.draft_tokens_accepted += num_kept

    def note_pool_eviction(self) -> None:
        self.num_pool_evictions += 1

    def note_finish(self, now: float, reason: str) -> None:
        self.last_finish_at = now
        self.finished_by_reason[reason] += 1

    def recent_tokens_per_s(self, now: float) -> float | None:
        """Generated tokens per second over the last RECENT_WINDOW_S seconds."""
        self._forget_before(now - RECENT_WINDOW_S)
        if len(self._recent) < 2:
            return None
        (start, first), (end, last) = self._recent[0], self._recent[-1]
        return (last - first) / (end - start) if end > start else None

    def _forget_before(self, moment: float) -> None:
        while self._recent and self._recent[0][0] < moment:
            self._recent.popleft()

    def add_phase(self, phase: str, seconds: float) -> None:
        self.phase_seconds[phase] += seconds

    def record_step(self, decode_seconds: float, num_decode_tokens: int, num_prefill_tokens: int,
                    num_generated: int) -> None:
        """One llama_decode: its time, what it held, and how many tokens it generated."""
        self.num_steps += 1
        self.generated_tokens += num_generated
        now = time.perf_counter()
        self._recent.append((now, self.generated_tokens))
        self._forget_before(now - RECENT_WINDOW_S)  # bounded even when nothing reads the rate
        self.prompt_tokens += num_prefill_tokens
        if num_decode_tokens:
            self.num_decode_steps += 1
            self.decode_seconds += decode_seconds
            self.decode_step_tokens += num_generated
            self.decode_step_seqs += num_decode_tokens
        elif num_prefill_tokens:
            self.prefill_seconds += decode_seconds
            self.prefill_step_tokens += num_prefill_tokens

    def snapshot(self) -> RunStats:
        wall = 0.0
        if self.first_submit_at is not None:
            end = self.last_finish_at if self.last_finish_at is not None else time.perf_counter()
            wall = max(0.0, end - self.first_submit_at)
        return RunStats(
            num_steps=self.num_steps,
            num_decode_steps=self.num_decode_steps,
            generated_tokens=self.generated_tokens,
            prompt_tokens=self.prompt_tokens,
            wall_s=wall,
            decode_tokens_per_s=_ratio(self.decode_step_tokens, self.decode_seconds),
            prefill_tokens_per_s=_ratio(self.prefill_step_tokens, self.prefill_seconds),
            aggregate_tokens_per_s=_ratio(self.generated_tokens, wall),
            avg_seqs_per_decode_step=_ratio(self.decode_step_seqs, self.num_decode_steps),
            phase_seconds=dict(self.phase_seconds),
            num_admitted=self.num_admitted,
            num_prefix_hits=self.num_prefix_hits,
            prompt_tokens_reused=self.prompt_tokens_reused,
            prompt_tokens_restored=self.prompt_tokens_restored,
            num_preempted=self.num_preempted,
            draft_tokens=self.draft_tokens,
            draft_tokens_accepted=self.draft_tokens_accepted,
            num_pool_evictions=self.num_pool_evictions,
        )


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


@dataclass(frozen=True)
class SlotSnapshot:
    """One slot at one moment, for a display."""

    slot: int
    request_id: str | None  # None: the slot is idle
    phase: str  # "prefill", "decode" or "idle"
    prompt_tokens: int
    generated_tokens: int
    context_used: int  # tokens in the slot's KV
    window: int
    tokens_per_s: float | None
    text_tail: str
    is_slid: bool  # its prompt was slid or its generation shifted
    cached_tokens: int = 0  # prompt tokens reused from a resident prefix (an idle slot: tokens kept)
    draft_tokens: int = 0  # speculative decoding: draft tokens verified for its request
    draft_tokens_accepted: int = 0  # of those, how many came true


@dataclass(frozen=True)
class QueuedSnapshot:
    """A request waiting for a slot at one moment: new, or parked (its KV in host memory)."""

    request_id: str
    prompt_tokens: int
    generated_tokens: int  # a parked request's output so far
    is_parked: bool
    waited_s: float  # since it was submitted


@dataclass(frozen=True)
class HostCacheSnapshot:
    """The RAM tier of the prefix cache (--cache-ram) at one moment."""

    limit_bytes: int  # 0: off
    num_bytes: int
    num_entries: int
    num_saved: int
    num_restored: int
    num_evicted: int
    tokens_restored: int
    num_imported: int = 0  # states another replica handed over
    disk: DiskSnapshot | None = None  # the disk tier under it (--cache-disk; None: off)


@dataclass(frozen=True)
class DiskSnapshot:
    """The disk tier of the prefix cache (--cache-disk) at one moment."""

    limit_bytes: int
    num_bytes: int
    num_files: int
    num_written: int
    num_read: int  # states read back to be restored
    num_evicted: int
    num_damaged: int  # files that failed their check: removed, never restored
    num_failed_writes: int  # a full disk, say: the state was not kept


@dataclass(frozen=True)
class PoolSnapshot:
    """A KV pool the slots share, at one moment: its cells, those in use, the positions the
    slots hold (a shared cell counted once per slot holding it), and what it gave away."""

    size: int
    cells_used: int
    tokens_held: int
    tokens_shared: int  # positions held on cells another slot holds too: what sharing saves
    num_evicted: int  # kept prefixes (idle conversations) moved out for room
    num_parked: int  # running requests parked in host memory for room, or priority
    # Held in a window per slot now (kv_layout "auto", every slot fitting its window); None: one pool always.
    in_windows: bool | None = None
    layout_moves: int = 0  # moves between windows and one pool
    layout_move_seconds: float = 0.0


@dataclass(frozen=True)
class RunnerSnapshot:
    """The whole runner at one moment: plain values a display can render without locks."""

    slots: list[SlotSnapshot]
    num_waiting: int
    num_running: int
    num_succeeded: int
    num_failed: int
    num_cancelled: int
    recent_tokens_per_s: float | None
    stats: RunStats
    host_cache: HostCacheSnapshot | None = None
    pool: PoolSnapshot | None = None
    queue: tuple[QueuedSnapshot, ...] = ()  # the first QUEUE_SHOWN waiting, in admission order


# Enough of the queue for a display; num_waiting counts them all.
QUEUE_SHOWN = 32


# Enough recent pieces to show the end of the text being generated.
_TAIL_PIECES = 48
_TAIL_CHARS = 120


def runner_snapshot(scheduler: Scheduler, stats: StatsRecorder, window: int, now: float,
                    host_cache: HostCache | None = None, layout=None) -> RunnerSnapshot:
    """Every slot and counter at this moment, as plain values."""
    finished = stats.finished_by_reason
    slots = [_slot_snapshot(slot.index, slot.holder, window, now, len(slot.kept)) for slot in scheduler.slots]
    return RunnerSnapshot(
        slots=slots,
        num_waiting=len(scheduler.waiting),
        num_running=len(scheduler.running),
        num_succeeded=finished["stop"] + finished["length"],
        num_failed=finished["error"],
        num_cancelled=finished["cancelled"],
        recent_tokens_per_s=stats.recent_tokens_per_s(now),
        stats=stats.snapshot(),
        host_cache=None if host_cache is None else host_cache_snapshot(host_cache),
        pool=None if scheduler.pool is None else _pool_snapshot(scheduler.pool, stats, layout),
        queue=tuple(QueuedSnapshot(seq.id, len(seq.prompt_tokens), len(seq.output_tokens), seq.parked is not None,
                                   max(0.0, now - seq.submitted_at))
                    for seq in islice(scheduler.waiting, QUEUE_SHOWN)),
    )


def _pool_snapshot(pool, stats: StatsRecorder, layout) -> PoolSnapshot:
    """`layout`: the LayoutChoice moving the pool between windows and one pool (None: one pool)."""
    used, held = pool.num_used, pool.num_held
    moves = {} if layout is None else dict(in_windows=not layout.pooled, layout_moves=layout.num_moves,
                                           layout_move_seconds=layout.move_seconds)
    return PoolSnapshot(pool.size, used, held, held - used, stats.num_pool_evictions, stats.num_preempted, **moves)


def host_cache_snapshot(cache: HostCache) -> HostCacheSnapshot:
    counts = cache.stats
    disk = None
    if cache.disk is not None:
        written = cache.disk.stats
        disk = DiskSnapshot(cache.disk.limit_bytes, cache.disk.num_bytes, cache.disk.num_files, written.num_written,
                            written.num_read, written.num_evicted, written.num_damaged, written.num_failed_writes)
    return HostCacheSnapshot(cache.limit_bytes, cache.num_bytes, cache.num_entries, counts.num_saved,
                             counts.num_restored, counts.num_evicted, counts.tokens_restored, counts.num_imported, disk)


def _slot_snapshot(slot: int, seq: Sequence | None, window: int, now: float, num_kept: int) -> SlotSnapshot:
    if seq is None:
        return SlotSnapshot(slot, None, "idle", 0, 0, num_kept, window, None, "", False, num_kept)
    rate = None
    if seq.first_token_at is not None and now > seq.first_token_at:
        rate = len(seq.output_tokens) / (now - seq.first_token_at)
    return SlotSnapshot(
        slot=slot,
        request_id=seq.id,
        phase=seq.status.value,
        prompt_tokens=len(seq.prompt_tokens),
        generated_tokens=len(seq.output_tokens),
        context_used=seq.n_past,
        window=window,
        tokens_per_s=rate,
        text_tail="".join(seq.pieces.text_parts[-_TAIL_PIECES:])[-_TAIL_CHARS:],
        is_slid=seq.is_truncated,
        cached_tokens=seq.num_cached,
        draft_tokens=seq.num_drafted,
        draft_tokens_accepted=seq.num_draft_accepted,
    )
