"""Embeddings on a real model: a document cut into chunks over several steps, beside greedy
streams, pools to the vector it has computed whole (batch-invariant: exactly), and the streams'
text does not change; the pooled vector is the mean of its tokens' rows; texts about the same
thing lie nearer than texts about different things."""

from __future__ import annotations

import numpy as np
import pytest

from multiseq import Request, SamplingParams

pytestmark = pytest.mark.model

DOCUMENT = ("The river floods every spring, and the farmers along its banks plant their fields only after "
            "the water has gone down again. ") * 3


def test_a_document_in_chunks_beside_streams_pools_to_its_vector_computed_whole(unpacked_model, real_runner):
    smollm = unpacked_model("smollm2-135m")
    [whole] = real_runner(smollm, parallel=4, slot_ctx=256, batch_invariant=True).run_batch(
        [Request(prompt=DOCUMENT, embed="mean")])
    streams = [Request(prompt=f"Count from {start}:", sampling=SamplingParams(max_tokens=24, temperature=0,
                                                                             ignore_eos=True))
               for start in (1, 5, 9)]
    alone = real_runner(smollm, parallel=4, slot_ctx=256, batch_invariant=True).run_batch(streams)
    runner = real_runner(smollm, parallel=4, slot_ctx=256, n_batch=64, step_tokens=32, batch_invariant=True)
    mixed = runner.run_batch([*streams, Request(prompt=DOCUMENT, embed="mean")])
    assert whole.ok and whole.embedding.shape == (576,) and whole.prompt_tokens > 32, "premise: several chunks"
    assert np.array_equal(mixed[3].embedding, whole.embedding)
    assert [result.text for result in mixed[:3]] == [result.text for result in alone]


def test_the_pooled_vector_is_the_mean_of_the_rows_and_similar_texts_lie_nearer(smollm, real_runner):
    runner = real_runner(smollm, parallel=4, slot_ctx=256)
    texts = ["The cat sat on the mat and purred.", "A kitten was sleeping on the rug.",
             "Quarterly revenue rose by four percent."]
    pooled = runner.run_batch([Request(prompt=text, embed="mean") for text in texts])
    [rows] = runner.run_batch([Request(prompt=texts[0], embed="none")])
    assert rows.embedding.shape == (pooled[0].prompt_tokens, 576)
    assert np.allclose(rows.embedding.mean(axis=0), pooled[0].embedding, atol=1e-4)
    unit = [result.embedding / np.linalg.norm(result.embedding) for result in pooled]
    assert unit[0] @ unit[1] > unit[0] @ unit[2], "premise: a 135M model's states still tell cats from revenue"
