"""Several models behind one server, on fake backends: every API's `model` picks the runner that
answers, /v1/models (and Ollama's lists) say each model's state, an unknown model is a 404 in
the API's own shape, a model still loading or one that could not load is a 503 naming it while
the others serve."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import threading
from types import SimpleNamespace

import anthropic
import numpy as np
import ollama
import openai
import pytest

from fakes import BOS, FakeBackend, LatestMention, fake_embedding_rows
from helpers import post_json, wait_until
from multiseq.server import ServerSettings, create_app
from multiseq.server.budget import MemoryBudget, ModelMemory
from multiseq.server.loader import ModelLoader
from multiseq.server.models import ServedModels
from multiseq.server.serve import _load_at_start

ALPHA, BETA, LATER, GAMMA, DELTA = "chat-alpha", "chat-beta", "still-loading", "chat-gamma", "chat-delta"
HI = [{"role": "user", "content": "Hi"}]


def fake(reply: str) -> FakeBackend:
    backend = FakeBackend(num_slots=2, window=512, n_batch=64)
    backend.replies = LatestMention({"<user>Hi<assistant>": reply.encode()})
    return backend


@pytest.fixture
def two_models(make_runner, serve_app):
    """A server with ALPHA (the default) and BETA loaded, and LATER not yet: its base URL."""
    app = create_app(make_runner(fake("I am alpha.")),
                     ServerSettings(model_name=ALPHA, more_models=(BETA, LATER)))
    app.state.server.attach(make_runner(fake("I am beta.")), BETA)
    return serve_app(app)


def get(base: str, path: str) -> tuple[int, dict]:
    status, text = get_text(base, path)
    return status, json.loads(text)


def get_text(base: str, path: str) -> tuple[int, str]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data.decode()


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


def loading_app(make_runner, models_max: int = 0, keep_alive_s: float = math.inf, fails: tuple[str, ...] = (),
                room_timeout_s: float = 2.0, memory: MemoryBudget | None = None, **settings):
    """An app whose models (ALPHA, BETA, GAMMA, DELTA) its loader opens on fake backends (those
    in `fails` raise), with --models-max and --models-keep-alive; the names opened, in order."""
    app = create_app(None, ServerSettings(model_name=ALPHA, more_models=(BETA, GAMMA, DELTA), models_max=models_max,
                                          model_keep_alive_s=keep_alive_s, **settings))
    state, opened = app.state.server, []

    def open_runner(name: str):
        opened.append(name)
        if name in fails:
            raise RuntimeError(f"no such file: {name}.gguf")
        return make_runner(fake(f"I am {name}."))

    for model in state.models:
        model.config = model.name
    state.loader = ModelLoader(state.models, open_runner, state.attach, models_max, room_timeout_s=room_timeout_s,
                               on_unloaded=state.forget_runner, keep_alive_s=keep_alive_s, memory=memory)
    return app, opened


def statuses(base: str) -> list[str]:
    return [card["status"]["value"] for card in get(base, "/v1/models")[1]["data"]]


def chat_with(base: str, model: str, **fields) -> tuple[int, dict]:
    return post(base, "/v1/chat/completions", {"model": model, "messages": HI, "temperature": 0, **fields})


def test_a_model_loads_at_its_first_request(make_runner, serve_app):
    app, opened = loading_app(make_runner)
    base = serve_app(app)
    assert statuses(base) == ["unloaded"] * 4 and opened == []
    status, body = chat_with(base, BETA)
    assert status == 200 and body["choices"][0]["message"]["content"] == f"I am {BETA}." and opened == [BETA]
    assert statuses(base) == ["unloaded", "loaded", "unloaded", "unloaded"]
    assert chat_with(base, BETA)[0] == 200 and opened == [BETA], "loaded once"


def test_metrics_say_each_models_state_by_name(make_runner, serve_app):
    app, _ = loading_app(make_runner)
    base = serve_app(app)
    assert chat_with(base, BETA, max_tokens=4)[0] == 200
    status, data = get_text(base, "/metrics")
    assert status == 200
    assert f'multiseq_model_loaded{{model="{ALPHA}"}} 0.0' in data and f'multiseq_model_loaded{{model="{BETA}"}} 1.0' in data
    assert f'multiseq_model_requests_running{{model="{BETA}"}} 0.0' in data
    generated = next(line for line in data.splitlines()
                     if line.startswith(f'multiseq_model_generation_tokens_total{{model="{BETA}"}}'))
    assert float(generated.split()[-1]) > 0 and f'model_generation_tokens_total{{model="{GAMMA}"}}' not in data


def test_within_models_max_the_least_recently_used_idle_model_goes(make_runner, serve_app):
    app, opened = loading_app(make_runner, models_max=3)
    base = serve_app(app)
    models = app.state.server.models
    for model in (ALPHA, BETA, GAMMA):
        assert chat_with(base, model)[0] == 200
    for model, idle_for in ((ALPHA, 30), (BETA, 20), (GAMMA, 10)):  # all idle; the default's use the oldest
        models.named(model).picked_at -= idle_for
    status, body = chat_with(base, DELTA)
    assert status == 200 and body["model"] == DELTA
    assert statuses(base) == ["loaded", "unloaded", "loaded", "loaded"], "BETA, the least recently used but the default"
    assert opened == [ALPHA, BETA, GAMMA, DELTA]


def test_no_room_when_every_loaded_model_is_busy_is_a_503(make_runner, serve_app):
    app, _ = loading_app(make_runner, models_max=2, room_timeout_s=0.3)
    base = serve_app(app)
    for model in (ALPHA, BETA):
        assert chat_with(base, model)[0] == 200
    status, body = chat_with(base, GAMMA)  # both picked under a second ago: neither counts as idle yet
    assert status == 503 and body["error"]["code"] == "models_busy" and "--models-max" in body["error"]["message"]


def test_an_idle_model_unloads_after_its_keep_alive_and_comes_back(make_runner, serve_app):
    app, opened = loading_app(make_runner, keep_alive_s=0.0)
    base = serve_app(app)
    assert chat_with(base, BETA)[0] == 200
    app.state.server.models.named(BETA).picked_at -= 10
    wait_until(lambda: statuses(base)[1] == "unloaded", what="BETA unloaded once idle")
    assert chat_with(base, BETA)[0] == 200 and opened == [BETA, BETA]


def test_a_model_loaded_without_a_request_keeps_the_servers_keep_alive(make_runner, serve_app):
    app, _ = loading_app(make_runner, keep_alive_s=0.0)
    base = serve_app(app)
    assert post(base, "/models/load", {"model": GAMMA}) == (200, {"success": True})
    assert statuses(base)[2] == "loaded"
    wait_until(lambda: statuses(base)[2] == "unloaded", what="GAMMA unloaded once idle")


def test_load_and_unload_in_llama_servers_and_ollamas_shapes(make_runner, serve_app):
    app, opened = loading_app(make_runner)
    base = serve_app(app)
    assert post(base, "/models/load", {"model": GAMMA}) == (200, {"success": True}) and statuses(base)[2] == "loaded"
    assert post(base, "/models/unload", {"model": GAMMA}) == (200, {"success": True})
    assert statuses(base)[2] == "unloaded"
    status, body = post(base, "/models/unload", {"model": ALPHA})
    assert status == 400 and "stays loaded" in body["error"]["message"]
    client = ollama.Client(host=base)
    assert client.generate(model=BETA).done_reason == "load" and statuses(base)[1] == "loaded"
    assert [model.model for model in client.ps().models] == [BETA]
    assert client.generate(model=BETA, keep_alive=0).done_reason == "unload" and statuses(base)[1] == "unloaded"
    assert opened == [GAMMA, BETA]


def test_while_every_loaded_model_is_idle_the_others_are_prepared_once_each():
    """A load's GIL-holding work (the constraints' tokenizer) is done ahead, while no stream
    would stall: never while a loaded model runs something, and once a model."""
    models = ServedModels([ALPHA, BETA, GAMMA])
    for model in models:
        model.config = model.name
    prepared: list[str] = []
    loader = ModelLoader(models, None, None, prepare=prepared.append)
    snapshot = SimpleNamespace(num_running=1)
    models.default.runner = SimpleNamespace(num_waiting=0, latest_snapshot=snapshot, failure=None)
    asyncio.run(loader._prepare_one_while_idle())
    assert prepared == [], "a stream runs on ALPHA"
    snapshot.num_running = 0
    for _ in range(4):
        asyncio.run(loader._prepare_one_while_idle())
    assert prepared == [BETA, GAMMA], "one a sweep; ALPHA is loaded"


def test_within_a_memory_budget_a_model_is_prepared_only_where_what_it_keeps_fits():
    models = ServedModels([ALPHA, BETA, GAMMA])
    for model in models:
        model.config = model.name
    prepared: list[str] = []
    budget = MemoryBudget(1000 * 2**20, lambda name, room: ModelMemory(
        {ALPHA: 500, BETA: 300, GAMMA: 300}[name] * 2**20, {ALPHA: 10, BETA: 450, GAMMA: 100}[name] * 2**20, name))
    budget.baseline_bytes = 100 * 2**20
    loader = ModelLoader(models, None, None, prepare=prepared.append, memory=budget)
    models.default.runner = SimpleNamespace(num_waiting=0, latest_snapshot=SimpleNamespace(num_running=0), failure=None)
    asyncio.run(budget.measured(ALPHA, ALPHA))
    budget.kept.add(ALPHA)  # loaded: 100 + 500 + 10 used
    for _ in range(3):
        asyncio.run(loader._prepare_one_while_idle())
    assert prepared == [] and budget.kept == {ALPHA}, "BETA would keep 450 MiB beside 610: over 1000"
    models.named(BETA).failure = "set aside for this test"
    asyncio.run(loader._prepare_one_while_idle())
    assert prepared == [GAMMA] and budget.kept == {ALPHA, GAMMA}, "GAMMA's 100 MiB fits"


def test_a_request_on_a_model_unloaded_under_it_says_so(make_runner, serve_app):
    app = create_app(None, ServerSettings(model_name=ALPHA, more_models=(BETA,)))
    state = app.state.server

    def open_runner(name: str):
        backend = fake(f"I am {name}.")
        backend.decode_delay = 0.05  # the stream is still running when the model goes
        return make_runner(backend)

    for model in state.models:
        model.config = model.name
    state.loader = ModelLoader(state.models, open_runner, state.attach, on_unloaded=state.forget_runner)
    base = serve_app(app)
    assert post(base, "/models/load", {"model": BETA})[0] == 200
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model=BETA, messages=HI, stream=True, max_tokens=200,
                                            extra_body={"ignore_eos": True, "min_tokens": 200})
    next(iter(stream))
    assert post(base, "/models/unload", {"model": BETA}) == (200, {"success": True})
    with pytest.raises(openai.APIError, match="'chat-beta' was unloaded"):
        for _ in stream:
            pass


def test_a_model_that_cannot_load_fails_its_requests_and_the_others_go_on(make_runner, serve_app):
    app, opened = loading_app(make_runner, fails=(BETA,))
    base = serve_app(app)
    assert chat_with(base, ALPHA)[0] == 200
    status, body = chat_with(base, BETA)
    assert status == 503 and body["error"]["code"] == "model_failed" and BETA in body["error"]["message"]
    assert statuses(base) == ["loaded", "failed", "unloaded", "unloaded"] and chat_with(base, GAMMA)[0] == 200


def test_when_no_model_can_load_at_start_the_server_stops_saying_why(make_runner):
    app, _ = loading_app(make_runner, fails=(ALPHA, BETA, GAMMA, DELTA))
    server = SimpleNamespace(state=app.state.server, should_exit=False)
    failure: list[str] = []
    asyncio.run(_load_at_start(server, None, failure))
    assert server.should_exit and failure == ["the model could not load: no such file: chat-alpha.gguf"]
    app.state.server.close()


def test_a_models_files_aliases_pick_their_model_and_its_deferred_models_wait_for_a_request(make_runner,
                                                                                           serve_app):
    app, opened = loading_app(make_runner, model_aliases=(("small", BETA), ("tiny", BETA)),
                              deferred_models=(ALPHA, GAMMA))
    server = SimpleNamespace(state=app.state.server, should_exit=False)
    asyncio.run(_load_at_start(server, None, []))
    assert opened == [ALPHA, BETA, DELTA], "GAMMA is loaded at its first request; the default always at start"
    base = serve_app(app)
    status, body = chat_with(base, "tiny")
    assert status == 200 and body["choices"][0]["message"]["content"] == f"I am {BETA}."
    assert [card["aliases"] for card in get(base, "/v1/models")[1]["data"]] == [[], ["small", "tiny"], [], []]
    assert chat_with(base, GAMMA)[0] == 200 and opened == [ALPHA, BETA, DELTA, GAMMA]


def within_memory(limit_mib: int, **mib: int) -> MemoryBudget:
    """A budget of limit_mib (the process's own 100 MiB of it), each model's share in `mib`
    while loaded, and 10 MiB it keeps for the process once loaded."""
    budget = MemoryBudget(limit_mib * 2**20, lambda name, room: ModelMemory(mib[name] * 2**20, 10 * 2**20, name))
    budget.baseline_bytes = 100 * 2**20
    return budget


def test_within_a_memory_budget_a_load_unloads_the_least_recently_used_idle_models_it_needs(make_runner,
                                                                                          serve_app):
    app, opened = loading_app(make_runner, memory=within_memory(1000, **{ALPHA: 300, BETA: 300, GAMMA: 250,
                                                                         DELTA: 500}))
    server = SimpleNamespace(state=app.state.server, should_exit=False)
    asyncio.run(_load_at_start(server, None, []))
    assert opened == [ALPHA, BETA, GAMMA], "DELTA does not fit beside them: it waits for its first request"
    base = serve_app(app)
    models = app.state.server.models
    for model, idle_for in ((BETA, 20), (GAMMA, 30)):
        models.named(model).picked_at -= idle_for
    assert chat_with(base, DELTA)[0] == 200, "100 + 310 + 510 and 30 kept fits once GAMMA, then BETA, are unloaded"
    assert statuses(base) == ["loaded", "unloaded", "unloaded", "loaded"] and opened[-1] == DELTA


def test_a_model_over_the_memory_budget_alone_fails_its_requests_saying_so(make_runner, serve_app):
    app, opened = loading_app(make_runner, memory=within_memory(1000, **{ALPHA: 300, BETA: 950, GAMMA: 1, DELTA: 1}))
    base = serve_app(app)
    status, body = chat_with(base, BETA)
    assert status == 503 and body["error"]["code"] == "model_failed" and opened == []
    assert body["error"]["message"].startswith('The model "chat-beta" could not be loaded: it needs 960 MiB loaded, '
                                               'more than --models-memory leaves to one model (900 MiB of 1000 MiB)')


def test_a_model_that_cannot_fit_beside_the_default_is_refused_at_once(make_runner, serve_app):
    app, opened = loading_app(make_runner, room_timeout_s=60, memory=within_memory(1000, **{ALPHA: 500, BETA: 450,
                                                                                            GAMMA: 1, DELTA: 1}))
    base = serve_app(app)
    assert chat_with(base, ALPHA)[0] == 200
    status, body = chat_with(base, BETA)  # 100 + 510 + 460 > 1000, and the default stays loaded
    assert status == 503 and body["error"]["code"] == "models_memory" and opened == [ALPHA]
    assert "does not fit in --models-memory 1000 MiB beside the models that stay loaded" in body["error"]["message"]


def post(base: str, path: str, payload: dict) -> tuple[int, dict]:
    status, data = post_json(base, path, payload)
    return status, json.loads(data)


def test_requests_waiting_for_a_load_are_bounded_by_the_queue(make_runner, serve_app):
    app, opened = loading_app(make_runner, max_queue=2)
    loader, release = app.state.server.loader, threading.Event()
    open_now = loader.open_runner
    loader.open_runner = lambda config: (release.wait(30), open_now(config))[1]
    base = serve_app(app)
    answers: list[int] = []
    waiting = [threading.Thread(target=lambda: answers.append(chat_with(base, BETA)[0])) for _ in range(2)]
    for thread in waiting:
        thread.start()
    wait_until(lambda: app.state.server._num_awaiting_loads == 2, what="two requests waiting for BETA's load")
    status, body = chat_with(base, BETA)
    assert status == 503 and body["error"]["code"] == "queue_full" and "waiting for models to load" in \
        body["error"]["message"]
    release.set()
    for thread in waiting:
        thread.join(30)
    assert answers == [200, 200] and opened == [BETA]


def test_a_model_loaded_while_others_streamed_has_its_constraints_prepared_once_all_are_idle():
    """A load beside streams leaves the constraints' tokenizer (it holds the GIL); the sweep
    builds it at the first moment every loaded model is idle, once."""
    models = ServedModels([ALPHA, BETA])
    for model in models:
        model.config = model.name
    prepared: list[str] = []
    built = {ALPHA}  # ALPHA's load built its own; BETA loaded while ALPHA streamed
    loader = ModelLoader(models, None, None, prepare=lambda config: (prepared.append(config), built.add(config)),
                         is_prepared=lambda config: config in built)
    snapshot = SimpleNamespace(num_running=1)
    models.default.runner = SimpleNamespace(num_waiting=0, latest_snapshot=snapshot, failure=None)
    models.named(BETA).runner = SimpleNamespace(num_waiting=0, latest_snapshot=SimpleNamespace(num_running=0),
                                                failure=None)
    asyncio.run(loader._prepare_one_while_idle())
    assert prepared == [], "a stream runs on ALPHA"
    snapshot.num_running = 0
    for _ in range(3):
        asyncio.run(loader._prepare_one_while_idle())
    assert prepared == [BETA]
