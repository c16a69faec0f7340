"""Sampling is exact: the same top-k as a full sort, the same distribution as llama.cpp's
chain (top-k, top-p, min-p, temperature), reproducible per seed."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from multiseq.config import SamplingParams
from reference import reference_distribution
from multiseq.sampling.sampler import SequenceSampler, apply_penalties, sample_rows
from multiseq.sampling import topk
from multiseq.sampling.topk import top_k_sorted


@pytest.mark.parametrize("vocab_size, top_k", [(262144, 40), (49152, 40), (512, 5), (1000, 40), (300, 7), (4096, 1)])
def test_top_k_matches_a_full_sort(vocab_size, top_k):
    rng = np.random.default_rng(vocab_size + top_k)
    matrix = rng.normal(0, 3, (3, vocab_size)).astype(np.float32)
    matrix[1, :] = np.round(matrix[1, :])  # many ties
    ids, values = top_k_sorted(matrix, top_k)
    expected_values = -np.sort(-matrix, axis=1)[:, :top_k]
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(np.take_along_axis(matrix, ids, axis=1), values)
    assert all(len(set(row)) == top_k for row in ids.tolist())


@pytest.mark.parametrize("threads", [1, 3])
def test_top_k_of_many_rows_is_the_same_on_several_threads(monkeypatch, threads):
    """Rows split over threads (as when 16 rows of a 262k vocabulary are sampled) give every
    row exactly its own top-k, in row order."""
    monkeypatch.setattr(topk, "_thread_count", lambda: threads)
    rng = np.random.default_rng(threads)
    matrix = rng.normal(0, 3, (16, 262144)).astype(np.float32)
    matrix[5, :] = np.round(matrix[5, :])  # many ties
    ids, values = top_k_sorted(matrix, 40)
    np.testing.assert_array_equal(values, -np.sort(-matrix, axis=1)[:, :40])
    np.testing.assert_array_equal(np.take_along_axis(matrix, ids, axis=1), values)
    assert [len(set(row)) for row in ids.tolist()] == [40] * 16


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.3, top_k=10, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=0.5, top_k=0, top_p=0.7, min_p=0.0),
    SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.2),
])
def test_draws_follow_the_reference_distribution(params):
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, 1024).astype(np.float32)
    expected = reference_distribution(logits, params)
    num_draws = 40_000
    matrix = np.tile(logits, (50, 1))
    counts = np.zeros(logits.size)
    for call in range(num_draws // 50):
        samplers = [SequenceSampler(params, seed=123 + 50 * call + row, prompt_tokens=[]) for row in range(50)]
        for sampled in sample_rows(matrix.copy(), samplers):
            counts[sampled.token] += 1
    observed = counts / num_draws
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(expected)), "never draws a filtered-out token"
    tolerance = 4 * np.sqrt(expected * (1 - expected) / num_draws) + 1e-4
    assert np.all(np.abs(observed - expected) <= tolerance)


def test_same_seed_same_tokens_other_seed_other_tokens():
    rng = np.random.default_rng(2)
    matrix = rng.normal(0, 1, (64, 512)).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=1.0, min_p=0.0)

    def draw(seed: int) -> list[int]:
        sampler = SequenceSampler(params, seed=seed, prompt_tokens=[])
        tokens = []
        for i in range(64):
            tokens.append(sample_rows(matrix[i:i + 1].copy(), [sampler])[0].token)
            sampler.accept(tokens[-1])
        return tokens

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    rng = np.random.default_rng(3)
    matrix = rng.normal(0, 1, (4, 512)).astype(np.float32)
    greedy = SequenceSampler(SamplingParams(temperature=0), seed=0, prompt_tokens=[])
    sampled = SequenceSampler(SamplingParams(temperature=1.0), seed=0, prompt_tokens=[])
    tokens = [row.token for row in sample_rows(matrix.copy(), [greedy, sampled, greedy, sampled])]
    assert tokens[0] == int(matrix[0].argmax()) and tokens[2] == int(matrix[2].argmax())


def test_repeat_penalty_follows_llama_cpp():
    row = np.array([2.0, -2.0, 1.0, 4.0], dtype=np.float32)
    apply_penalties(row, deque([0, 1, 1]), SamplingParams(repeat_penalty=2.0))
    np.testing.assert_array_equal(row, [1.0, -4.0, 1.0, 4.0])


def test_banned_tokens_are_never_drawn():
    matrix = np.zeros((1, 512), dtype=np.float32)
    matrix[0, 7] = 50.0
    sampler = SequenceSampler(SamplingParams(temperature=0), seed=0, prompt_tokens=[], banned_tokens=[7])
    assert sample_rows(matrix, [sampler])[0].token != 7
