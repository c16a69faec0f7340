"""The runner and the model used from many threads at once, on a real model: what a server does."""

from __future__ import annotations

import threading

import pytest

from multiseq.loading import open_model

pytestmark = pytest.mark.model

NUM_THREADS = 4


def test_token_bytes_read_from_many_threads_are_each_tokens_own(smollm):
    """Several threads detokenizing at once (two runners on one model, or a server's request
    threads) each get their own token's bytes, never another thread's."""
    expected = [smollm.token_bytes(token) for token in range(smollm.n_vocab)]
    fresh = open_model("smollm2-135m")  # nothing cached yet: every call reaches llama.cpp
    try:
        seen: list[list[bytes] | None] = [None] * NUM_THREADS
        start = threading.Barrier(NUM_THREADS)

        def read_all(index: int) -> None:
            order = list(range(smollm.n_vocab))
            order = order[index::NUM_THREADS] + order  # each thread starts on tokens of its own
            start.wait()
            pieces = {token: fresh.token_bytes(token) for token in order}
            seen[index] = [pieces[token] for token in range(smollm.n_vocab)]

        threads = [threading.Thread(target=read_all, args=(index,)) for index in range(NUM_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        fresh.close()
    for pieces in seen:
        wrong = [token for token, (got, want) in enumerate(zip(pieces, expected)) if got != want]
        assert not wrong, f"{len(wrong)} tokens got another token's bytes, e.g. {wrong[:5]}"
