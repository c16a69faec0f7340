"""The vocabulary as constrained sampling sees it (llguidance's tokenizer), on a real model."""

from __future__ import annotations

import warnings


def test_the_grammar_tokenizer_reads_the_vocabulary_as_llguidances_own_adapter_does(smollm):
    """Every token's bytes, which tokens are special, and the end tokens are what llguidance's
    adapter for llama.cpp (llguidance.llamacpp) makes of the vocabulary: multiseq builds them
    with its own loop, which reads a token's attributes by llama.cpp's current name."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    with warnings.catch_warnings():  # the adapter calls a deprecated llama.cpp name per token
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = lltokenizer_from_vocab(smollm._vocab, n_vocab=smollm.n_vocab,
                                        eos_token=smollm.end_of_generation_tokens())
    ours = smollm.grammar_tokenizer()
    tokens = range(smollm.n_vocab)
    special = [token for token in tokens if theirs.is_special_token(token)]
    assert special, "the premise: the vocabulary has special tokens"
    assert [token for token in tokens if ours.is_special_token(token)] == special
    assert [ours.decode_bytes([token]) for token in tokens] == [theirs.decode_bytes([token]) for token in tokens]
    assert ours.eos_tokens == theirs.eos_tokens
    assert ours.vocab_size == theirs.vocab_size


def test_the_grammar_tokenizer_outlives_the_model_that_asked_for_it(smollm):
    """A model unloaded and loaded again (a server's on-demand models) finds its constraints'
    tokenizer built: the same one, which still tokenizes once the model that asked for it is
    closed, because it calls a vocabulary of its own (the closed model's is freed)."""
    from multiseq.loading import open_model

    first = open_model(smollm.path)
    tokenizer = first.grammar_tokenizer()
    first.close()
    second = open_model(smollm.path)
    try:
        assert second.grammar_tokenizer() is tokenizer and smollm.grammar_tokenizer() is tokenizer
        text = "Hello, world: {\"answer\": 42}"
        assert tokenizer.tokenize_str(text) == second.tokenize(text, add_special=False)
    finally:
        second.close()
