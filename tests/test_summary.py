"""The run summary's tally: counts, and TTFT percentiles from a bounded sample."""

from __future__ import annotations

import numpy as np
import pytest

from multiseq import FinishReason, Result, Timings
from multiseq.formats import summary


def result(ttft: float, reason: FinishReason = FinishReason.LENGTH) -> Result:
    return Result(id="x", text="", finish_reason=reason, prompt_tokens=3, completion_tokens=2,
                  timings=Timings(None, ttft, None, None, 1.0))


def test_counts_add_up_and_percentiles_are_exact_below_the_sample_size():
    tally = summary.RunTally()
    values = np.random.default_rng(0).exponential(1.0, 5_000)
    for value in values:
        tally.add_result(result(float(value)))
    tally.add_result(result(0.5, FinishReason.CANCELLED))
    tally.add_invalid()
    tally.add_not_started(7)
    assert (tally.num_succeeded, tally.num_cancelled, tally.num_failed, tally.num_not_started) == (5_000, 1, 1, 7)
    assert tally.num_requests == 5_009 and tally.generated_tokens == 10_002
    assert tally.ttft_percentile(95) == pytest.approx(np.percentile(np.append(values, 0.5), 95))


def test_beyond_the_sample_size_memory_stays_fixed_and_percentiles_stay_close(monkeypatch):
    monkeypatch.setattr(summary, "TTFT_SAMPLE_SIZE", 2_000)
    tally = summary.RunTally()
    values = np.linspace(0, 10, 100_000)  # rising, as TTFTs do while a queue drains
    for value in values:
        tally.add_result(result(float(value)))
    assert tally._ttfts.nbytes == 2_000 * 8
    assert tally.ttft_percentile(50) == pytest.approx(5.0, abs=0.4)
    assert tally.ttft_percentile(95) == pytest.approx(9.5, abs=0.2)
