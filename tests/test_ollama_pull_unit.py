"""Ollama's /api/pull on a server of fake models: a Hugging Face model pulled from a cache built
by hand (offline) is served under the name it was pulled by; what cannot be fetched says why, in
the stream Ollama's client reads."""

from __future__ import annotations

from pathlib import Path

import ollama
import pytest

from fakes import FakeBackend, LatestMention
from helpers import add_hub_repo, post_json
from multiseq.config import RunnerConfig
from multiseq.server import ServerSettings, create_app
from multiseq.server.loader import ModelLoader
from multiseq.server.ollama_pull import PULLED_FILE, serve_pulled

FAKE_GGUF = b"GGUF" + bytes(60)


def pull_server(make_runner, serve_app, data_dir=None):
    """A server whose one model is SmolLM2 (a fake), able to load what it pulls: each model
    answers with its file's name. With a data directory, the models pulled into it before are
    served again, as `multiseq serve` serves them after a restart."""
    app = create_app(None, ServerSettings(model_name="smollm2-135m", data_dir=data_dir))
    state = app.state.server
    state.models.default.config = RunnerConfig(model="smollm2-135m", parallel=2)
    serve_pulled(state)
    opened = []

    def open_runner(config: RunnerConfig):
        opened.append(config)
        backend = FakeBackend(num_slots=2, window=512, n_batch=64)
        backend.replies = LatestMention({"Hi": f"I am {Path(config.model).name}.".encode()})
        return make_runner(backend)

    state.loader = ModelLoader(state.models, open_runner, state.attach, on_unloaded=state.forget_runner)
    return serve_app(app), opened


@pytest.fixture
def server(make_runner, serve_app, hub_cache):
    add_hub_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF, "tiny-Q8_0.gguf": FAKE_GGUF + b"8"})
    return pull_server(make_runner, serve_app)


def test_a_pulled_hub_model_is_served_under_the_name_it_was_pulled_by(server):
    base, opened = server
    client = ollama.Client(host=base)
    statuses = [progress.status for progress in client.pull("hf.co/owner/tiny-GGUF:Q8_0", stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "hf.co/owner/tiny-GGUF:Q8_0" in [model.model for model in client.list().models]
    reply = client.generate(model="hf.co/owner/tiny-GGUF:Q8_0", prompt="Hi", options={"temperature": 0})
    assert reply.response == "I am tiny-Q8_0.gguf." and opened[-1].parallel == 2, "the first model's options"
    assert client.pull("hf.co/owner/tiny-GGUF:Q8_0").status == "success", "pulled again: at once"
    assert len(opened) == 1


def test_what_cannot_be_pulled_says_why(server):
    base, _ = server
    client = ollama.Client(host=base)
    for name, said, status in (
            ("llama3.2", "is not a model this server can fetch: give a name of multiseq's registry", 400),
            ("/etc/passwd", "is not a model this server can fetch", 400),
            ("hf.co/owner/absent-GGUF", "hf:owner/absent-GGUF is not in the server's Hugging Face cache", 500),
            ("hf.co/owner/tiny-GGUF:Q5_K", "has no GGUF model of quantization Q5_K", 500)):
        with pytest.raises(ollama.ResponseError, match=said):
            for _ in client.pull(name, stream=True):
                pass
        assert post_json(base, "/api/pull", {"model": name, "stream": False})[0] == status
    assert [model.model for model in client.list().models] == ["smollm2-135m"]


def test_a_pulled_model_is_served_again_after_a_restart_until_it_is_deleted(make_runner, serve_app, hub_cache,
                                                                             tmp_path):
    add_hub_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q8_0.gguf": FAKE_GGUF + b"8"})
    name = "hf.co/owner/tiny-GGUF:Q8_0"
    base, _ = pull_server(make_runner, serve_app, tmp_path)
    assert ollama.Client(host=base).pull(name).status == "success"
    assert (tmp_path / PULLED_FILE).exists()

    again, opened = pull_server(make_runner, serve_app, tmp_path)  # a server started again on the same data
    client = ollama.Client(host=again)
    assert name in [model.model for model in client.list().models]
    assert not opened, "a pulled model loads at its first request, not at start"
    assert client.generate(model=name, prompt="Hi", options={"temperature": 0}).response == "I am tiny-Q8_0.gguf."
    with pytest.raises(ollama.ResponseError, match="command line"):
        client.delete("smollm2-135m")
    with pytest.raises(ollama.ResponseError, match="not found"):
        client.delete("hf.co/owner/absent-GGUF")
    assert client.delete(name).status == "success"
    assert [model.model for model in client.list().models] == ["smollm2-135m"]

    third, _ = pull_server(make_runner, serve_app, tmp_path)
    assert [model.model for model in ollama.Client(host=third).list().models] == ["smollm2-135m"]
