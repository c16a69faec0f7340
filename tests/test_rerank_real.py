"""Rerankers and encoders on real GGUFs: tiny BERTs built here (tests/tiny_models.py), one with a
cross-encoder's classifier head. A document's score is what llama.cpp's rank pooling computes
(the head on the [CLS] row, checked here against the head applied in numpy to the [CLS]
embedding of the same model); the rerank doors answer in Jina's, Cohere's and TEI's shapes,
highest score first; an encoder's input is never cut, whatever the step's budget."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from helpers import post_json as post
from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.server import ServerSettings, create_app
from tiny_models import read_tensor, tiny_bert

pytestmark = pytest.mark.model

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france.", "the cats sat on the mat.", "rain water cycle " * 30, "blue sky"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("rerank") / "reranker.gguf", pooling="rank", rank_head=True)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("encoder") / "encoder.gguf", pooling="mean")


def head_on_cls(model_path, cls_row: np.ndarray) -> float:
    """A cross-encoder's classifier head (BERT's pooler: dense and tanh, then the output layer)."""
    dense, bias = read_tensor(model_path, "cls.weight"), read_tensor(model_path, "cls.bias")
    out, out_bias = read_tensor(model_path, "cls.output.weight"), read_tensor(model_path, "cls.output.bias")
    return float((out @ np.tanh(dense @ cls_row + bias) + out_bias)[0])


def test_a_documents_score_is_the_rerankers_head_on_its_pair(reranker):
    with Runner(RunnerConfig(model=str(reranker), parallel=4, slot_ctx=512, batch_invariant=True)) as runner:
        assert runner.pooling == "rank"
        pairs = [runner.backend.rerank_tokens(QUERY, document) for document in DOCUMENTS]
        query = runner.backend.tokenize(QUERY)[1:-1]  # without [CLS] and [SEP]
        ranked = runner.run_batch([Request(prompt=pair, embed="rank") for pair in pairs])
    with Runner(RunnerConfig(model=str(reranker), parallel=4, slot_ctx=512, pooling="cls",
                             batch_invariant=True)) as runner:
        cls_rows = runner.run_batch([Request(prompt=pair, embed="default") for pair in pairs])
    for pair, result, cls_row in zip(pairs, ranked, cls_rows):
        sep = pair.index(3)
        assert pair[0] == 2 and pair.count(3) == 1 and pair[1:sep] == query, \
            "[CLS] query [SEP] document, as llama-server lays out a pair for a WordPiece vocabulary"
        assert result.ok and result.embedding.shape == (1,)
        assert result.embedding[0] == pytest.approx(head_on_cls(reranker, cls_row.embedding), abs=1e-5)


def test_a_reranker_neither_generates_nor_embeds_and_says_so(reranker):
    with Runner(RunnerConfig(model=str(reranker), parallel=2, slot_ctx=256)) as runner:
        generated, embedded = runner.run_batch([Request(prompt="hello", sampling=SamplingParams(max_tokens=4)),
                                                Request(prompt="hello", embed="mean")])
    assert "reranker" in generated.error and "does not generate" in generated.error
    assert "reranker" in embedded.error and "--pooling mean" in embedded.error


@pytest.fixture
def served(reranker, serve_app):
    with Runner(RunnerConfig(model=str(reranker), parallel=4, slot_ctx=512)) as runner:
        yield serve_app(create_app(runner, ServerSettings(model_name="tiny-reranker"))), runner


def metrics_text(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics") as response:
        return response.read().decode()


def scores_alone(runner: Runner) -> list[float]:
    pairs = [runner.backend.rerank_tokens(QUERY, document) for document in DOCUMENTS]
    return [float(result.embedding[0]) for result in runner.run_batch([Request(prompt=p, embed="rank") for p in pairs])]


def test_jina_and_cohere_shape_highest_first_cut_to_top_n_with_documents(served):
    base, runner = served
    expected = scores_alone(runner)
    order = sorted(range(len(DOCUMENTS)), key=lambda index: -expected[index])
    for path in ("/v1/rerank", "/rerank", "/v1/reranking"):
        status, data = post(base, path, {"model": "tiny-reranker", "query": QUERY, "top_n": 3,
                                         "documents": [DOCUMENTS[0], *({"text": text} for text in DOCUMENTS[1:])],
                                         "return_documents": True})
        answer = json.loads(data)
        assert status == 200 and answer["object"] == "list" and answer["model"] == "tiny-reranker"
        assert [result["index"] for result in answer["results"]] == order[:3]
        for result in answer["results"]:
            assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-3)
            assert result["document"] == {"text": DOCUMENTS[result["index"]]}
        assert answer["usage"]["prompt_tokens"] == sum(len(runner.backend.rerank_tokens(QUERY, d)) for d in DOCUMENTS)


def test_cohere_clients_v1_and_v2_rank_through_the_server(served):
    import cohere

    base, runner = served
    expected = scores_alone(runner)
    order = sorted(range(len(DOCUMENTS)), key=lambda index: -expected[index])
    for client in (cohere.Client(api_key="unused", base_url=base), cohere.ClientV2(api_key="unused", base_url=base)):
        answer = client.rerank(model="tiny-reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
        assert [result.index for result in answer.results] == order[:2]
        assert [result.relevance_score for result in answer.results] == pytest.approx(
            [expected[index] for index in order[:2]], abs=1e-3)


def test_teis_shape_is_a_bare_list_with_scores_and_texts_when_asked(served):
    base, runner = served
    expected = scores_alone(runner)
    status, data = post(base, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:2], "return_text": True,
                                          "raw_scores": False})
    answer = json.loads(data)
    assert status == 200 and isinstance(answer, list) and len(answer) == 2
    assert answer[0]["score"] >= answer[1]["score"]
    for entry in answer:
        assert entry["score"] == pytest.approx(expected[entry["index"]], abs=1e-3)  # (another batch)
        assert entry["text"] == DOCUMENTS[entry["index"]]


@pytest.mark.parametrize("body, field, words", [
    ({"documents": ["a"]}, "query", "'query' must be a string"),
    ({"query": "q", "documents": []}, "documents", "non-empty list"),
    ({"query": "q", "documents": ["fine", 7]}, "documents[1]", "must be a string"),
    ({"query": "q", "documents": ["fine"], "top_n": 0}, "top_n", "integer >= 1"),
    ({"query": "q", "documents": ["fine", "rain " * 600]}, "documents[1]", "more than the 512"),
])
def test_a_bad_rerank_body_is_a_400_naming_the_field_and_nothing_runs(served, body, field, words):
    base, runner = served
    status, data = post(base, "/v1/rerank", body)
    error = json.loads(data)["error"]
    assert status == 400 and error["param"] == field and words in error["message"]
    assert 'api="rerank"' not in metrics_text(base), "the request was refused before anything ran"


def test_other_doors_say_what_a_reranker_is_for(served):
    base, _ = served
    status, data = post(base, "/v1/embeddings", {"input": "hello"})
    assert status == 400 and "/v1/rerank" in json.loads(data)["error"]["message"]


def test_a_model_that_is_no_reranker_refuses_rerank_clearly(encoder, serve_app):
    with Runner(RunnerConfig(model=str(encoder), parallel=2, slot_ctx=512)) as runner:
        base = serve_app(create_app(runner, ServerSettings(model_name="tiny-encoder")))
        status, data = post(base, "/v1/rerank", {"query": "q", "documents": ["d"]})
        assert status == 501 and "--pooling rank" in json.loads(data)["error"]["message"]


def test_an_encoders_inputs_beside_each_other_pool_exactly_as_alone_and_it_does_not_generate(encoder):
    """Whatever a step holds beside them (the planner's whole-input rule itself is checked on
    the fake backend, where a cut shows), an encoder's inputs pool exactly to their vectors
    computed alone, and a generation request is refused with the reason."""
    texts = (DOCUMENTS[2] * 3, *DOCUMENTS)
    config = dict(model=str(encoder), parallel=5, slot_ctx=512, n_batch=360, batch_invariant=True)
    with Runner(RunnerConfig(**config)) as runner:
        alone = [runner.run_batch([Request(prompt=text, embed="default")])[0].embedding for text in texts]
    with Runner(RunnerConfig(**config, step_tokens=16)) as runner:
        results = runner.run_batch([Request(prompt=text, embed="default") for text in texts])
        refused = runner.run_batch([Request(prompt="hello", sampling=SamplingParams(max_tokens=2))])[0]
    assert all(result.ok for result in results) and results[0].prompt_tokens > 256
    for result, vector in zip(results, alone):
        assert np.array_equal(result.embedding, vector)
    assert "encoder" in refused.error and "does not generate" in refused.error
