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
    prompt_tokens: int
    wall_s: float  # first submission -> last finished request
    decode_tokens_per_s: float | None  # generated tokens / time of decode steps
    prefill_tokens_per_s: float | None  # None when no step held prompt tokens only
    aggregate_tokens_per_s: float | None  # generated tokens / wall time
    avg_seqs_per_decode_step: float | None
    phase_seconds: dict[str, float] = field(default_factory=dict)

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
        self.prompt_tokens = 0
        self.first_submit_at: float | None = None
        self.last_finish_at: float | None = None
        self.phase_seconds = dict.fromkeys(STEP_PHASES, 0.0)
        self.finished_by_reason: Counter[str] = Counter()
        self._recent: deque[tuple[float, int]] = deque()  # (time, generated tokens so far) per step

    def note_submit(self, now: float) -> None:
        if self.first_submit_at is None:
            self.first_submit_at = now

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
