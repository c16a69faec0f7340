"""Speculative decoding on llama.cpp: a session that copies its prompt is drafted from it, the
drafts are verified in the step, and greedy output is plain decoding's, token for token.

SmolLM2's Q4_1 weights are multiplied row by row, so a draft's rows are bit-identical to lone
decoded tokens' (measured: every draft length up to 16); the test checks that premise on this
machine before it compares texts, and says so when the kernels differ here."""

from __future__ import annotations

import numpy as np
import pytest

from multiseq import Request, SamplingParams
from multiseq.llama.batch import BatchEntry

pytestmark = pytest.mark.model

LINES = "".join(f"total_{index} = price_{index} * count_{index}\n" for index in range(12))
ASK = f"Copy these lines exactly:\n{LINES}\nCopy:\n"
PARAMS = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)


def draft_rows_match_lone_rows(runner) -> bool:
    """Whether this machine's kernels compute a 5-token entry's rows as they compute each token
    decoded alone (in a scratch slot, cleared afterwards)."""
    backend = runner.engine.backend
    tokens = backend.tokenize(ASK)
    backend.decode([BatchEntry(1, tokens[:-5], 0, False)])
    together = np.array(backend.decode([BatchEntry(1, tokens[-5:], len(tokens) - 5, True, 4)]))
    backend.rewind_slot(1, len(tokens) - 5)
    alone = [np.array(backend.decode([BatchEntry(1, [token], len(tokens) - 5 + index, True)])[0])
             for index, token in enumerate(tokens[-5:])]
    backend.clear_slot(1)
    return bool(np.array_equal(together, np.stack(alone)))


def test_greedy_drafts_give_plain_decodings_text(smollm, real_runner):
    plain = real_runner(smollm, 2).run_batch([Request(prompt=ASK, sampling=PARAMS)])[0]
    runner = real_runner(smollm, 2, spec_type="ngram-simple")
    if not runner.between_steps(lambda: draft_rows_match_lone_rows(runner)):
        pytest.skip("this machine's kernels compute a draft's rows differently from lone tokens' (last bits): "
                    "greedy text may part at a near tie")
    [fast] = runner.run_batch([Request(prompt=ASK, sampling=PARAMS)])
    assert fast.draft_tokens_accepted > 0, "the copied lines were drafted from the prompt and kept"
    assert fast.text == plain.text and fast.completion_tokens == plain.completion_tokens == 64
    assert runner.stats().draft_tokens == fast.draft_tokens
