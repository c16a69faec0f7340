"""A run's tally and summary: counts, wall time, throughput, TTFT percentiles, prefill and decode
rates, as plain values (cli/summary.py renders them)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from ..request import FinishReason, Result
from ..loop.stats import RunStats


def percentile(values, percent: float) -> float | None:
    """The percentile of a sequence of numbers; None when it is empty."""
    return float(np.percentile(values, percent)) if len(values) else None


TTFT_SAMPLE_SIZE = 65_536  # 512 KB of float64: exact percentiles up to this many results


class RunTally:
    """What the summary needs from a run, in memory that does not grow with the run: counters,
    and a uniform sample of the time-to-first-token values (every value up to TTFT_SAMPLE_SIZE
    results, a reservoir sample of that size beyond, so p50 and p95 stay close)."""

    def __init__(self, seed: int = 0) -> None:
        self.num_succeeded = 0
        self.num_failed = 0  # errors, including lines that could not run and invalid outputs
        self.num_cancelled = 0  # stopped while running (their partial text is written)
        self.num_not_started = 0  # interrupted before they started (no line; --resume runs them)
        self.num_truncated = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self._ttfts = np.empty(TTFT_SAMPLE_SIZE, dtype=np.float64)
        self._num_ttfts = 0
        self._rng = random.Random(seed)

    def add_result(self, result: Result) -> None:
        self.num_succeeded += result.ok
        # An output that does not validate against its schema ended, but did not succeed.
        self.num_failed += result.finish_reason is FinishReason.ERROR or result.schema_error is not None
        self.num_cancelled += result.finish_reason is FinishReason.CANCELLED
        self.num_truncated += result.truncated
        self.prompt_tokens += result.prompt_tokens
        self.generated_tokens += result.completion_tokens
        if result.timings.ttft_s is not None:
            self._sample_ttft(result.timings.ttft_s)

    def add_invalid(self) -> None:
        self.num_failed += 1

    def add_not_started(self, count: int = 1) -> None:
        self.num_not_started += count

    def _sample_ttft(self, value: float) -> None:
        """Reservoir sampling (Algorithm R): every value seen has the same chance to be kept."""
        if self._num_ttfts < TTFT_SAMPLE_SIZE:
            self._ttfts[self._num_ttfts] = value
        else:
            index = self._rng.randrange(self._num_ttfts + 1)
            if index < TTFT_SAMPLE_SIZE:
                self._ttfts[index] = value
        self._num_ttfts += 1

    def ttft_percentile(self, percent: float) -> float | None:
        return percentile(self._ttfts[:min(self._num_ttfts, TTFT_SAMPLE_SIZE)], percent)

    @property
    def num_requests(self) -> int:
        return self.num_succeeded + self.num_failed + self.num_cancelled + self.num_not_started


def summarize(tally: RunTally, stats: RunStats, wall_s: float) -> dict[str, Any]:
    """Everything the summary table shows, as plain JSON-ready values."""
    return {
        "requests": tally.num_requests,
        "succeeded": tally.num_succeeded,
        "failed": tally.num_failed,
        "cancelled": tally.num_cancelled,
        "not_started": tally.num_not_started,
        "truncated": tally.num_truncated,
        "prompt_tokens": tally.prompt_tokens,
        "generated_tokens": tally.generated_tokens,
        "wall_s": wall_s,
        "tokens_per_s": tally.generated_tokens / wall_s if wall_s > 0 else None,
        "ttft_p50_s": tally.ttft_percentile(50),
        "ttft_p95_s": tally.ttft_percentile(95),
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "avg_seqs_per_decode_step": stats.avg_seqs_per_decode_step,
        "outside_decode_share": stats.outside_decode_share,
        "prompt_tokens_computed": stats.prompt_tokens,
        "prompt_tokens_reused": stats.prompt_tokens_reused,
        "prompt_tokens_from_ram": stats.prompt_tokens_restored,
        "prefix_hit_rate": stats.prefix_hit_rate,
    }
