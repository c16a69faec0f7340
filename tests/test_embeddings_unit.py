"""Embedding requests in the engine, on the fake backend: a prompt's rows (one per token, from
its context, as a causal model's hidden state) pooled as asked, in whatever chunks the prompt
is cut and beside whatever else runs; the steps that carry them carry no other prompt; streams
keep decoding beside them; nothing is reused from a cache, and nothing is left to reuse."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import BOS, FakeBackend, fake_embedding_rows
from multiseq import Request, SamplingParams

DOCUMENT = "Retrieval puts the documents nearest a question beside it in the prompt."


def rows_of(text: str) -> np.ndarray:
    return fake_embedding_rows([BOS, *text.encode()])


def embed(text=DOCUMENT, pooling="mean", **fields) -> Request:
    return Request(prompt=text, embed=pooling, **fields)


@pytest.mark.parametrize("pooling, expected", [
    ("mean", lambda rows: rows.mean(axis=0)),
    ("cls", lambda rows: rows[0]),
    ("last", lambda rows: rows[-1]),
    ("none", lambda rows: rows),
])
def test_a_prompts_rows_are_pooled_as_asked_and_nothing_is_generated(make_runner, pooling, expected):
    [result] = make_runner(FakeBackend()).run_batch([embed(pooling=pooling)])
    assert result.ok and result.finish_reason.value == "stop"
    assert result.text == "" and result.completion_tokens == 0
    assert result.prompt_tokens == len(DOCUMENT) + 1
    assert result.embedding.dtype == np.float32
    assert np.allclose(result.embedding, expected(rows_of(DOCUMENT)), atol=1e-6)


def test_the_same_embedding_in_any_chunks_beside_streams_that_keep_decoding(make_runner):
    whole = make_runner(FakeBackend()).run_batch([embed()])[0]
    backend = FakeBackend(n_batch=16)
    runner = make_runner(backend, step_tokens=8)
    streams = [Request(prompt=f"stream {index}", sampling=SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
               for index in range(3)]
    alone = make_runner(FakeBackend()).run_batch(streams)
    results = runner.run_batch([*streams, embed(), embed(DOCUMENT * 2)])
    assert np.allclose(results[3].embedding, whole.embedding, atol=1e-6)
    assert np.allclose(results[4].embedding, rows_of(DOCUMENT * 2).mean(axis=0), atol=1e-6)
    assert [result.text for result in results[:3]] == [result.text for result in alone], "the streams are exact"
    embedding_steps = [call for call in backend.calls if any(entry[1] > 1 for entry in call.entries)
                       and len(call.decoding_slots) == 3]
    assert embedding_steps, "the documents were computed in steps that decoded the three streams too"
    assert max(call.num_tokens for call in backend.calls) <= 8, "no step went past its token budget"


def test_a_step_carries_embedding_chunks_or_other_prompt_chunks_never_both(make_runner):
    backend = FakeBackend(n_batch=64)
    runner = make_runner(backend)
    chats = [Request(prompt=f"a chat prompt of some length {index}", sampling=SamplingParams(max_tokens=2))
             for index in range(2)]
    results = runner.run_batch([embed(), *chats, embed("another document to embed")])
    assert all(result.ok for result in results)
    steps = [([slot for slot, _, is_prefill in call.entries if is_prefill], call.embedding_slots)
             for call in backend.calls]
    assert any(embedding for _, embedding in steps) and any(set(prefill) - set(embedding) for prefill, embedding in steps)
    for prefilling, embedding in steps:
        assert not embedding or set(prefilling) == set(embedding), "a chat's prompt beside a document"
    assert np.allclose(results[3].embedding, rows_of("another document to embed").mean(axis=0), atol=1e-6)


def test_an_embedding_reuses_no_cached_prefix_and_leaves_none(make_runner):
    runner = make_runner(FakeBackend())
    plain = Request(prompt=DOCUMENT + " and more", sampling=SamplingParams(max_tokens=2))
    runner.run_batch([plain])
    [first] = runner.run_batch([embed()])
    assert first.prompt_tokens_cached == 0
    [again] = runner.run_batch([embed()])
    assert again.prompt_tokens_cached == 0 and np.allclose(again.embedding, first.embedding)
    [chat] = runner.run_batch([Request(prompt=DOCUMENT, sampling=SamplingParams(max_tokens=2))])
    assert chat.prompt_tokens_cached == len(DOCUMENT), "the chat's own prefix stayed; the embeddings left nothing"


def test_a_kv_too_full_for_an_embedding_chunk_halves_it_and_the_vector_stays(make_runner):
    whole = make_runner(FakeBackend()).run_batch([embed()])[0]
    [halved] = make_runner(FakeBackend(no_kv_slot_above=12)).run_batch([embed()])
    assert np.allclose(halved.embedding, whole.embedding, atol=1e-6)


def test_token_ids_embed_as_their_text_and_bad_input_is_its_own_error(make_runner):
    runner = make_runner(FakeBackend(window=64))
    by_text, by_ids, outside, too_long = runner.run_batch([
        embed(), embed((BOS, *DOCUMENT.encode())), embed((BOS, 104, 9999)), embed("x" * 70)])
    assert np.array_equal(by_ids.embedding, by_text.embedding)
    assert not outside.ok and "prompt token 9999 is not in the vocabulary" in outside.error
    assert not too_long.ok and "the input has 71 tokens, more than a slot's 64-token window" in too_long.error


@pytest.mark.parametrize("fields, message", [
    (dict(prompt="x", embed="max"), "embed must be one of mean, cls, last, none"),
    (dict(messages=({"role": "user", "content": "x"},), embed="mean"), "an embedding request needs a prompt"),
])
def test_an_embedding_request_says_what_is_wrong_with_it(fields, message):
    with pytest.raises(ValueError, match=message):
        Request(**fields)


def test_an_input_pooled_whole_is_never_cut_and_waits_for_room_instead(make_runner):
    """A BERT's rows depend on every token of its input (its attention looks both ways): an
    input goes into one decode whole, never in chunks: one that does not fit what is left of a
    decode waits for the next (the step budget, for streams, does not apply: there are none)."""
    backend = FakeBackend(n_batch=90)  # the document (73 tokens) and the first short one fill a decode
    backend.embeds_whole = True
    runner = make_runner(backend, step_tokens=8)
    short = "short text"
    results = runner.run_batch([embed(short), embed(), embed(short + " two")])
    assert all(result.ok for result in results)
    for call in backend.calls:
        for slot, length, _ in call.entries:
            assert slot not in call.embedding_slots or length in (len(short) + 1, len(DOCUMENT) + 1,
                                                                  len(short) + 5), "an input was cut"
    assert np.allclose(results[1].embedding, rows_of(DOCUMENT).mean(axis=0), atol=1e-6)


def test_an_input_longer_than_a_decode_can_take_whole_is_its_own_clear_error(make_runner):
    backend = FakeBackend(n_batch=32)
    backend.embeds_whole = True
    ok, too_long = make_runner(backend).run_batch([embed("fits"), embed(DOCUMENT)])
    assert ok.ok
    assert not too_long.ok and "at most -b/--batch-size (32) tokens" in too_long.error


def test_an_encoder_does_not_generate_and_says_why(make_runner):
    backend = FakeBackend()
    backend.embeds_whole = True
    [result] = make_runner(backend).run_batch([Request(prompt="hello", sampling=SamplingParams(max_tokens=4))])
    assert not result.ok and "encoder" in result.error and "does not generate" in result.error


def test_inputs_pooled_whole_that_find_no_kv_room_together_go_one_by_one_never_halved(make_runner):
    backend = FakeBackend(n_batch=128, no_kv_slot_above=len(DOCUMENT) + 1)
    backend.embeds_whole = True
    long, short = make_runner(backend).run_batch([embed(), embed("a short one")])
    assert long.ok and short.ok
    assert np.allclose(long.embedding, rows_of(DOCUMENT).mean(axis=0), atol=1e-6)
    for call in backend.calls:
        for slot, length, _ in call.entries:
            assert slot not in call.embedding_slots or length in (len(DOCUMENT) + 1, len("a short one") + 1), \
                "an input was cut"
