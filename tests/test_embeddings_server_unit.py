"""The embedding doors over HTTP on the fake backend: OpenAI's /v1/embeddings (through the
official client, which asks for base64), llama-server's /embedding, and bad inputs as 400s that
name the input and run nothing."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest

from fakes import BOS, FAKE_N_EMBD, FakeBackend, fake_embedding_rows
from helpers import post_json as post
from multiseq.server import ServerSettings, create_app

DOCUMENTS = ["The first document.", "A second one, a little longer than the first."]


def expected_vector(text: str) -> np.ndarray:
    mean = fake_embedding_rows([BOS, *text.encode()]).astype(np.float64).mean(axis=0)
    return mean / np.linalg.norm(mean)


@pytest.fixture
def serve(make_runner, serve_app):
    def start(backend=None, **config):
        runner = make_runner(backend or FakeBackend(window=64), **config)
        return serve_app(create_app(runner, ServerSettings(model_name="fake-model"))), runner

    return start


def test_the_openai_client_gets_a_normalized_vector_per_input_in_order(serve):
    base, _ = serve()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model="fake-model", input=DOCUMENTS)  # base64 on the wire
    assert [item.index for item in answer.data] == [0, 1]
    for item, text in zip(answer.data, DOCUMENTS):
        assert len(item.embedding) == FAKE_N_EMBD
        assert np.allclose(item.embedding, expected_vector(text), atol=1e-6)
    assert answer.usage.prompt_tokens == sum(len(text) + 1 for text in DOCUMENTS) == answer.usage.total_tokens


def test_floats_token_ids_and_one_string_give_the_same_vectors(serve):
    base, _ = serve()
    ids = [BOS, *DOCUMENTS[0].encode()]
    for body in ({"input": DOCUMENTS[0]}, {"input": ids}, {"input": [ids], "encoding_format": "float"}):
        status, data = post(base, "/v1/embeddings", body)
        answer = json.loads(data)
        assert status == 200 and answer["object"] == "list" and len(answer["data"]) == 1
        assert np.allclose(answer["data"][0]["embedding"], expected_vector(DOCUMENTS[0]), atol=1e-6)
    status, data = post(base, "/v1/embeddings", {"input": DOCUMENTS[1], "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(json.loads(data)["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vector, expected_vector(DOCUMENTS[1]), atol=1e-6)


def test_llama_servers_embedding_route_pools_and_normalizes_as_asked(serve):
    base, _ = serve()
    status, data = post(base, "/embedding", {"content": DOCUMENTS})
    answer = json.loads(data)
    assert status == 200 and [item["index"] for item in answer] == [0, 1]
    assert np.allclose(answer[1]["embedding"][0], expected_vector(DOCUMENTS[1]), atol=1e-6)
    status, data = post(base, "/embedding", {"content": DOCUMENTS[0], "embd_normalize": -1})
    raw = fake_embedding_rows([BOS, *DOCUMENTS[0].encode()]).mean(axis=0)
    assert np.allclose(json.loads(data)[0]["embedding"][0], raw, atol=1e-6)


def test_with_pooling_none_embedding_gives_every_tokens_row_and_v1_refuses(serve):
    base, _ = serve(pooling="none")
    status, data = post(base, "/embedding", {"content": DOCUMENTS[0]})
    rows = json.loads(data)[0]["embedding"]
    assert status == 200 and np.allclose(rows, fake_embedding_rows([BOS, *DOCUMENTS[0].encode()]), atol=1e-6)
    status, data = post(base, "/v1/embeddings", {"input": DOCUMENTS[0]})
    assert status == 400 and "pools no embeddings" in json.loads(data)["error"]["message"]


@pytest.mark.parametrize("body, param, words", [
    ({"input": ["fine", ""]}, "input[1]", "is empty"),
    ({"input": ["fine", [104, 99999]]}, "input[1]", "token 99999 is not in the vocabulary"),
    ({"input": ["fine", "x" * 80]}, "input[1]", "it has 81 tokens, more than a slot's 64-token window"),
    ({"input": []}, "input", "non-empty list"),
    ({"input": "fine", "dimensions": 4}, "dimensions", "have 8 dimensions"),
    ({"input": "fine", "encoding_format": "int8"}, "encoding_format", "float or base64"),
    ({"input": "fine", "frobnicate": True}, "frobnicate", "not an embeddings field"),
])
def test_a_bad_input_is_a_400_naming_it_and_nothing_runs(serve, body, param, words):
    base, runner = serve()
    status, data = post(base, "/v1/embeddings", body)
    error = json.loads(data)["error"]
    assert status == 400 and error["param"] == param and words in error["message"]
    assert runner.stats().num_admitted == 0, "no input of the request ran"


def test_embeddings_and_streams_share_the_engine_and_the_metrics_count_them_apart(serve):
    base, _ = serve(FakeBackend(window=64, n_batch=16), step_tokens=8)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(model="fake-model", prompt="a stream", max_tokens=30, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    first = next(stream)
    answer = client.embeddings.create(model="fake-model", input=DOCUMENTS)
    text = first.choices[0].text + "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert len(answer.data) == 2 and len(text) > 0
    metrics = post_metrics(base)
    assert 'multiseq_api_requests_total{api="embeddings"} 1.0' in metrics
    assert "multiseq_embedding_inputs_total 2.0" in metrics
    assert f"multiseq_embedding_prompt_tokens_total {float(sum(len(d) + 1 for d in DOCUMENTS))}" in metrics


def post_metrics(base: str) -> str:
    import urllib.request
    with urllib.request.urlopen(f"{base}/metrics") as response:
        return response.read().decode()
