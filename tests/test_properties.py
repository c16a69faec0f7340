"""Properties that must hold for any input: the stop-string matcher, prompt fitting, top-k."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from multiseq import OverflowPolicy
from multiseq.loop.detok import StopMatcher
from multiseq.sampling.topk import top_k_sorted
from multiseq.loop.scheduler import PromptDoesNotFit, fit_prompt

# A small alphabet makes stop strings, partial matches and overlaps common.
TEXT = st.text(alphabet="abc\n", max_size=40)
STOPS = st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({cut % (len(text) + 1) for cut in cuts} | {0, len(text)})
    return [text[start:end] for start, end in zip(points, points[1:])]


@given(TEXT, STOPS, st.lists(st.integers(0, 40), max_size=12))
def test_emitted_plus_held_text_is_the_input_up_to_the_stop(text, stops, cuts):
    matcher = StopMatcher(tuple(stops))
    emitted, received, stopped = "", "", False
    for piece in split(text, cuts):
        received += piece
        out, stopped = matcher.feed(piece)
        emitted += out
        if stopped:
            break
        assert emitted + matcher.held == received, "nothing is lost or invented while no stop was met"
        assert not any(stop in emitted for stop in stops), "no stop string is ever emitted"
    if stopped:
        assert received.startswith(emitted) and any(received[len(emitted):].startswith(s) for s in stops)
        assert not any(stop in emitted for stop in stops)
    else:
        assert emitted + matcher.flush() == text
        assert not any(stop in text for stop in stops)


@given(st.integers(0, 300), st.integers(16, 128), st.integers(0, 40), st.one_of(st.none(), st.integers(1, 300)),
       st.sampled_from(list(OverflowPolicy)))
def test_a_fitted_prompt_keeps_its_head_and_newest_tail_and_leaves_room(length, window, n_keep, max_tokens, policy):
    tokens = list(range(1000, 1000 + length))
    room = max(1, min(max_tokens or window, window // 2))
    try:
        fit = fit_prompt(tokens, window, n_keep, max_tokens, policy)
    except PromptDoesNotFit:
        if policy is OverflowPolicy.REJECT:
            assert length >= window
        else:
            assert length >= window and window - room - n_keep < 1
        return
    assert policy is OverflowPolicy.SLIDE or length < window, "reject never slides"
    if length < window:
        assert fit.tokens == tokens and fit.num_dropped == 0
        wanted = max_tokens if max_tokens is not None else window - length
        # reject caps what the window cannot hold; slide leaves a request's ask as it is
        assert fit.max_tokens == (min(wanted, window - length) if policy is OverflowPolicy.REJECT else wanted)
        return
    kept_tail = fit.tokens[n_keep:]
    assert fit.tokens[:n_keep] == tokens[:n_keep]
    assert kept_tail == tokens[length - len(kept_tail):], "the tail is the prompt's newest tokens"
    assert fit.num_dropped == length - len(fit.tokens)
    assert len(fit.tokens) + room <= window
    assert fit.max_tokens == (max_tokens if max_tokens is not None else room)


VOCAB_SIZES = st.sampled_from([48, 64, 96, 500, 512, 1024, 4096, 49152])


@settings(max_examples=150, deadline=None)
@given(vocab=VOCAB_SIZES, rows=st.integers(1, 4), k_fraction=st.floats(0, 1), seed=st.integers(0, 2**32 - 1),
       ties=st.booleans())
def test_top_k_is_exactly_the_k_largest_of_each_row(vocab, rows, k_fraction, seed, ties):
    top_k = 1 + int(k_fraction * (min(vocab, 64) - 1))
    rng = np.random.default_rng(seed)
    # Small integers give many ties; floats give the general case. The matrix comes from a
    # drawn seed: hypothesis cannot draw megabytes of floats, but it can shrink a seed.
    matrix = (rng.integers(-5, 6, (rows, vocab)) if ties else rng.normal(0, 10, (rows, vocab))).astype(np.float32)
    ids, values = top_k_sorted(matrix, top_k)
    np.testing.assert_array_equal(values, -np.sort(-matrix, axis=1)[:, :top_k])
    np.testing.assert_array_equal(np.take_along_axis(matrix, ids, axis=1), values)
    assert all(len(set(row)) == top_k for row in ids.tolist()), "k distinct tokens"
