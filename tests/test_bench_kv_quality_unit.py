"""bench/kv_quality.py's pure helpers, without a model: the KL divergence of two logits rows,
the greedy pick with banned tokens, and the counts and summaries the script reports."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import kv_quality  # noqa: E402 - bench/ is a folder of scripts, not a package


def test_identical_rows_have_zero_kl():
    logits = np.array([[1.0, 2.0, 3.0, -4.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    assert kv_quality.kl_divergence_rows(logits, logits) == pytest.approx([0.0, 0.0], abs=1e-15)


def test_kl_of_a_known_pair():
    # p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)
    p_logits = np.log([[0.5, 0.5]])
    q_logits = np.log([[0.25, 0.75]])
    assert kv_quality.kl_divergence_rows(p_logits, q_logits) == pytest.approx([0.5 * math.log(4 / 3)], rel=1e-12)
    # KL is not symmetric: KL(q || p) = 1/4 ln(1/2) + 3/4 ln(3/2)
    assert kv_quality.kl_divergence_rows(q_logits, p_logits) == pytest.approx(
        [0.25 * math.log(0.5) + 0.75 * math.log(1.5)], rel=1e-12)


def test_kl_ignores_a_constant_shift_and_survives_large_logits():
    p_logits = np.array([[1000.0, 999.0, 0.0]])
    q_logits = p_logits + 123.0  # the same distribution: softmax ignores a shift
    assert kv_quality.kl_divergence_rows(p_logits, q_logits) == pytest.approx([0.0], abs=1e-12)
    assert np.all(np.isfinite(kv_quality.kl_divergence_rows(p_logits, np.array([[0.0, 1000.0, 0.0]]))))


def test_greedy_pick_skips_banned_tokens_and_leaves_the_row_alone():
    row = np.array([0.1, 5.0, 3.0, 4.0], dtype=np.float32)
    assert kv_quality.greedy_pick(row, []) == 1
    assert kv_quality.greedy_pick(row, [1]) == 3
    assert row[1] == 5.0  # the backend's row is a view: it must not be written


def test_count_equal_and_summary():
    assert kv_quality.count_equal([[1, 2], [3, 4], [5]], [[1, 2], [3, 5], [5]]) == 2
    summary = kv_quality.kl_summary(np.array([0.0, 0.25, 0.5, 0.25]), np.array([False, True, False, False]))
    assert summary == {"mean_kl": 0.25, "max_kl": 0.5, "argmax_differs": 0.25, "positions": 4}
