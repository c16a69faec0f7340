"""Constrained sampling is exact: whatever path a row takes (its own candidates, the gathered
allowed tokens, a filtered pool, a masked row), it draws from the distribution of masking the
row first and then running the usual chain; greedy rows take the argmax over allowed tokens."""

from __future__ import annotations

import string

import numpy as np
import pytest

from fakes import FakeBackend
from multiseq.sampling import constrained
from multiseq.config import SamplingParams
from multiseq.sampling.grammar import TokenConstraint
from multiseq.sampling.sampler import SequenceSampler, sample_rows
from reference import reference_distribution

VOCAB = 512
ALPHANUMERIC = string.ascii_letters + string.digits  # the fake's byte tokens a grammar can name plainly


def random_allowed(rng: np.random.Generator, size: int) -> list[int]:
    return sorted(ord(char) for char in rng.choice(list(ALPHANUMERIC), size=size, replace=False))


def one_of(tokens: list[int], params: SamplingParams) -> TokenConstraint:
    """A real compiled constraint that allows exactly these byte tokens next."""
    grammar = "root ::= [" + "".join(chr(token) for token in tokens) + "]"
    return TokenConstraint(FakeBackend().grammar_tokenizer(), SamplingParams(grammar=grammar, **_fields(params)))


def _fields(params: SamplingParams) -> dict:
    return dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)


def constrained_samplers(allowed: list[int], params: SamplingParams, count: int, seed: int) -> list[SequenceSampler]:
    return [SequenceSampler(SamplingParams(grammar="root ::= [a]", **_fields(params)), seed=seed + index,
                            prompt_tokens=[], constraint=one_of(allowed, params)) for index in range(count)]


def masked(logits: np.ndarray, allowed: list[int]) -> np.ndarray:
    out = np.full_like(logits, -np.inf)
    out[allowed] = logits[allowed]
    return out


# Each path forced by shrinking the limits of the cheaper ones.
PATHS = {
    "gathered": dict(SPARSE_LIMIT=constrained.SPARSE_LIMIT),
    "pool": dict(SPARSE_LIMIT=0),
    "masked-row": dict(SPARSE_LIMIT=0, MIN_POOL=1, POOL_FACTOR=1),
}


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.3, top_k=10, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=0.5, top_k=0, top_p=0.7, min_p=0.0),
    SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.2),
])
# boost 4: the allowed tokens stand out, so a row's own top-k is often all allowed.
@pytest.mark.parametrize("path, boost", [("gathered", 0.0), ("gathered", 4.0), ("pool", 0.0), ("masked-row", 0.0)])
def test_constrained_draws_follow_mask_first_then_chain(params, path, boost, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(constrained, name, value)
    rng = np.random.default_rng(7)
    allowed = random_allowed(rng, 50)
    logits = rng.normal(0, 2, VOCAB).astype(np.float32)
    logits[allowed] += boost
    expected = reference_distribution(masked(logits, allowed), params)
    num_rows, num_calls = 100, 50
    counts = np.zeros(VOCAB)
    # A draw advances no constraint (accepting its token would) and is a function of the row's
    # seed: the same rows draw again under new seeds, their grammars compiled once.
    samplers = constrained_samplers(allowed, params, num_rows, seed=0)
    for call in range(num_calls):
        for index, sampler in enumerate(samplers):
            sampler.seed = 11 + num_rows * call + index
        for sampled in sample_rows(np.tile(logits, (num_rows, 1)), samplers):
            counts[sampled.token] += 1
    num_draws = num_rows * num_calls
    observed = counts / num_draws
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(expected)), "never draws a forbidden or filtered token"
    tolerance = 4.5 * np.sqrt(expected * (1 - expected) / num_draws) + 1e-4
    assert np.all(np.abs(observed - expected) <= tolerance)


def test_each_path_is_taken(monkeypatch):
    """The paths the test above forces are real: count the full-row masks and the cases where a
    row's own candidates were kept."""
    full_masks = []
    real_allowed_row = constrained.allowed_row
    monkeypatch.setattr(constrained, "allowed_row", lambda *args: full_masks.append(1) or real_allowed_row(*args))
    recomputed = []
    import multiseq.sampling.sampler as sampling
    real_masked_top_k = sampling.masked_top_k
    monkeypatch.setattr(sampling, "masked_top_k", lambda *args: recomputed.append(1) or real_masked_top_k(*args))
    rng = np.random.default_rng(3)
    allowed = random_allowed(rng, 50)
    params = SamplingParams(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0)
    logits = rng.normal(0, 2, VOCAB).astype(np.float32)
    logits[allowed] += 8.0  # the top 5 are all allowed
    sample_rows(logits[None, :].copy(), constrained_samplers(allowed, params, 1, seed=0))
    assert not recomputed, "a row whose top-k is all allowed keeps its candidates"
    logits[allowed] -= 16.0
    monkeypatch.setattr(constrained, "SPARSE_LIMIT", 0)
    monkeypatch.setattr(constrained, "MIN_POOL", 1)
    monkeypatch.setattr(constrained, "POOL_FACTOR", 1)
    sample_rows(logits[None, :].copy(), constrained_samplers(allowed, params, 1, seed=0))
    assert recomputed and full_masks, "a row whose pool holds too few allowed tokens masks the row"


@pytest.mark.parametrize("path", list(PATHS))
def test_greedy_takes_the_argmax_over_allowed_tokens(path, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(constrained, name, value)
    rng = np.random.default_rng(5)
    greedy = SamplingParams(temperature=0.0)
    for trial in range(30):
        allowed = random_allowed(rng, int(rng.integers(1, 40)))
        logits = rng.normal(0, 2, (4, VOCAB)).astype(np.float32)
        logits[:, allowed] += rng.choice([0.0, 5.0])
        if trial % 3 == 0:
            logits = np.round(logits)  # ties: the lowest allowed id wins, like argmax over a masked row
        samplers = constrained_samplers(allowed, greedy, 4, seed=trial)
        tokens = [sampled.token for sampled in sample_rows(logits.copy(), samplers)]
        assert tokens == [int(masked(row, allowed).argmax()) for row in logits]


def test_allowed_tokens_at_minus_infinity_leave_the_first_allowed_one():
    """Only banned tokens allowed (say end-of-generation under ignore_eos): the sampler never
    invents a forbidden token; it hands the matcher an allowed one."""
    logits = np.zeros((2, VOCAB), dtype=np.float32)
    allowed = [ord("a"), ord("b")]
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)):
        sampler = SequenceSampler(params, seed=0, prompt_tokens=[], banned_tokens=allowed,
                                  constraint=one_of(allowed, params))
        assert sample_rows(logits[:1].copy(), [sampler])[0].token == ord("a")
