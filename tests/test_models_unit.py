"""Several models behind one server, on fake backends: every API's `model` picks the runner that
answers, /v1/models (and Ollama's lists) say each model's state, an unknown model is a 404 in
the API's own shape, a model still loading or one that could not load is a 503 naming it while
the others serve."""

from __future__ import annotations

import http.client
import json
from types import SimpleNamespace

import anthropic
import numpy as np
import ollama
import openai
import pytest

from fakes import BOS, FakeBackend, fake_embedding_rows
from multiseq.server import ServerSettings, create_app
from multiseq.server.serve import _load_models

ALPHA, BETA, LATER = "chat-alpha", "chat-beta", "still-loading"
HI = [{"role": "user", "content": "Hi"}]


class ByMention(dict):
    """Scripted replies chosen by a key the prompt holds."""

    def get(self, prompt, default=None):
        return next((reply for key, reply in self.items() if key in prompt), default)


def fake(reply: str) -> FakeBackend:
    backend = FakeBackend(num_slots=2, window=512, n_batch=64)
    backend.replies = ByMention({"<user>Hi<assistant>": reply.encode()})
    return backend


@pytest.fixture
def two_models(make_runner, serve_app):
    """A server with ALPHA (the default) and BETA loaded, and LATER not yet: its base URL."""
    app = create_app(make_runner(fake("I am alpha.")),
                     ServerSettings(model_name=ALPHA, more_models=(BETA, LATER)))
    app.state.server.attach(make_runner(fake("I am beta.")), BETA)
    return serve_app(app)


def get(base: str, path: str) -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data)


def test_each_api_answers_with_the_model_it_names(two_models):
    client = openai.OpenAI(base_url=f"{two_models}/v1", api_key="unused", max_retries=0)
    for model, reply in ((ALPHA, "I am alpha."), (BETA, "I am beta.")):
        answer = client.chat.completions.create(model=model, messages=HI, temperature=0)
        assert answer.choices[0].message.content == reply and answer.model == model
        response = client.responses.create(model=model, input="Hi", temperature=0)
        assert response.output_text == reply and response.model == model
        message = anthropic.Anthropic(base_url=two_models, api_key="unused", max_retries=0).messages.create(
            model=model, max_tokens=32, messages=HI, extra_body={"temperature": 0})
        assert message.content[0].text == reply
        chat = ollama.Client(host=two_models).chat(model=f"{model}:latest", messages=HI, options={"temperature": 0})
        assert chat.message.content == reply and chat.model == model
    # A request that names no model goes to the default, the first.
    status, body = post(two_models, "/v1/chat/completions", {"messages": HI, "temperature": 0})
    assert status == 200 and body["model"] == ALPHA and body["choices"][0]["message"]["content"] == "I am alpha."


def test_an_embedding_comes_from_the_model_named(two_models):
    client = openai.OpenAI(base_url=f"{two_models}/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model=BETA, input="Hello")
    mean = fake_embedding_rows([BOS, *b"Hello"]).astype(np.float64).mean(axis=0)
    assert answer.model == BETA and np.allclose(answer.data[0].embedding, mean / np.linalg.norm(mean), atol=1e-6)


def test_the_lists_say_each_models_state(two_models):
    status, listed = get(two_models, "/v1/models")
    assert status == 200 and [(card["id"], card["status"]["value"]) for card in listed["data"]] == [
        (ALPHA, "loaded"), (BETA, "loaded"), (LATER, "loading")]
    assert get(two_models, f"/v1/models/{BETA}")[1]["id"] == BETA
    assert get(two_models, f"/props?model={BETA}")[1]["model"] == BETA
    client = ollama.Client(host=two_models)
    assert [model.model for model in client.list().models] == [ALPHA, BETA, LATER]
    assert [model.model for model in client.ps().models] == [ALPHA, BETA]  # loaded ones
    assert client.list().models[2].size is None  # a model still loading has no facts yet


def test_unknown_and_loading_models_are_refused_in_each_apis_shape(two_models):
    status, body = post(two_models, "/v1/chat/completions", {"model": "llama3", "messages": HI})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert all(name in body["error"]["message"] for name in (ALPHA, BETA, LATER))
    status, body = post(two_models, "/v1/chat/completions", {"model": LATER, "messages": HI})
    assert status == 503 and body["error"]["code"] == "model_loading" and LATER in body["error"]["message"]
    status, body = post(two_models, "/v1/messages", {"model": "llama3", "max_tokens": 8, "messages": HI})
    assert status == 404 and body["type"] == "error" and body["error"]["type"] == "not_found_error"
    status, body = post(two_models, "/api/chat", {"model": "llama3", "messages": HI})
    assert status == 404 and body == {"error": "model 'llama3' not found"}
    assert get(two_models, "/health") == (200, {"status": "ok"})


def test_a_model_that_cannot_load_fails_its_requests_and_the_others_go_on(make_runner, serve_app):
    app = create_app(None, ServerSettings(model_name=ALPHA, more_models=(BETA,)))

    def open_runner(config):
        if config == "beta":
            raise RuntimeError("no such file: beta.gguf")
        return make_runner(fake("I am alpha."))

    failure: list[str] = []
    _load_models(SimpleNamespace(state=app.state.server, should_exit=False), ["alpha", "beta"], open_runner, None,
                 failure)
    base = serve_app(app)
    assert not failure and post(base, "/v1/chat/completions", {"model": ALPHA, "messages": HI})[0] == 200
    status, body = post(base, "/v1/chat/completions", {"model": BETA, "messages": HI})
    assert status == 503 and body["error"]["code"] == "model_failed" and BETA in body["error"]["message"]
    assert [card["status"]["value"] for card in get(base, "/v1/models")[1]["data"]] == ["loaded", "failed"]


def test_when_no_model_can_load_the_server_stops_saying_why():
    app = create_app(None, ServerSettings(model_name=ALPHA, more_models=(BETA,)))
    server = SimpleNamespace(state=app.state.server, should_exit=False)
    failure: list[str] = []

    def open_runner(config):
        raise RuntimeError(f"no such file: {config}.gguf")

    _load_models(server, ["alpha", "beta"], open_runner, None, failure)
    assert server.should_exit and failure == ["the model could not load: no such file: alpha.gguf"]
    app.state.server.close()


def post(base: str, path: str, payload: dict) -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data)
