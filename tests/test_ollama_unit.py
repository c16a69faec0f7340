"""Ollama's API on the fake backend, spoken to with Ollama's own Python client (`ollama`): chat and
generate, whole and streamed; tools with arguments as objects and results named by tool_name;
format; embeddings; the model list, show, ps and version; errors in Ollama's shape."""

from __future__ import annotations

import http.client
import json

import numpy as np
import ollama
import pytest

from fakes import BOS, FAKE_N_EMBD, FakeBackend, LatestMention, fake_embedding_rows
from multiseq.server import ServerSettings, create_app

MODEL = "fake-model"
HI_PROMPT = "<system>Be brief.<user>Hi<assistant>"  # how the fake backend renders a system and "Hi"
HELLO = "Hello there!"
PARIS = "What is the weather in Paris?"
PARIS_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
SUNNY = "Sunny, 21 C"
SUNNY_REPLY = "It is sunny in Paris."
# The result as the generic format renders it: named after the call it answers (found by its id).
SUNNY_RESULT = '{"tool_response": {"name": "get_weather", "content": "Sunny, 21 C"}}'
UNIT = "Pick a unit"
UNIT_JSON = '{"unit": "celsius"}'
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
GREEDY = {"temperature": 0}


@pytest.fixture
def server(make_runner, serve_app):
    """server(**settings) -> (ollama client, base URL), on a fake backend with scripted replies."""
    def start(**settings):
        backend = FakeBackend(num_slots=4, window=1024, n_batch=64)
        backend.replies = LatestMention({key: reply.encode("utf-8") for key, reply in {
            HI_PROMPT: HELLO, "<user>Hi<assistant>": HELLO, PARIS: PARIS_CALL, SUNNY_RESULT: SUNNY_REPLY,
            UNIT: UNIT_JSON}.items()})
        base = serve_app(create_app(make_runner(backend), ServerSettings(model_name=MODEL, **settings)))
        headers = {"Authorization": f"Bearer {settings['api_key']}"} if settings.get("api_key") else None
        return ollama.Client(host=base, headers=headers), base
    return start


def test_chat_whole_and_streamed(server):
    client, _ = server()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    answer = client.chat(model=MODEL, messages=messages, options=GREEDY, stream=False)
    assert answer.message.role == "assistant" and answer.message.content == HELLO
    assert answer.done and answer.done_reason == "stop" and answer.model == MODEL
    assert answer.prompt_eval_count == len(HI_PROMPT) + 1 and answer.eval_count >= len(HELLO)
    assert answer.total_duration > 0 and answer.created_at.endswith("Z")
    parts = list(client.chat(model=MODEL, messages=messages, options=GREEDY, stream=True))
    assert "".join(part.message.content for part in parts) == HELLO
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == answer.eval_count


def test_generate_renders_the_prompt_with_the_system_or_takes_it_raw(server):
    client, _ = server()
    answer = client.generate(model=MODEL, prompt="Hi", system="Be brief.", options=GREEDY)
    assert answer.response == HELLO and answer.done and answer.prompt_eval_count == len(HI_PROMPT) + 1
    streamed = list(client.generate(model=MODEL, prompt="Hi", system="Be brief.", options=GREEDY, stream=True))
    assert "".join(part.response for part in streamed) == HELLO and streamed[-1].done
    raw = client.generate(model=MODEL, prompt=HI_PROMPT, raw=True, options=GREEDY | {"num_predict": 5})
    assert raw.response == HELLO[:5] and raw.done_reason == "length" and raw.eval_count == 5


def test_an_empty_request_loads_the_model(server):
    client, _ = server()
    assert client.generate(model=MODEL).done_reason == "load"
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"


def test_a_tool_round_trip_with_arguments_as_objects(server):
    client, _ = server()
    messages = [{"role": "user", "content": PARIS}]
    answer = client.chat(model=MODEL, messages=messages, tools=[WEATHER_TOOL], options=GREEDY)
    [call] = answer.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    streamed = list(client.chat(model=MODEL, messages=messages, tools=[WEATHER_TOOL], options=GREEDY, stream=True))
    calls = [call for part in streamed for call in part.message.tool_calls or ()]
    assert [(call.function.name, call.function.arguments) for call in calls] == [("get_weather", {"city": "Paris"})]
    assert not "".join(part.message.content for part in streamed) and streamed[-1].done
    follow_up = messages + [answer.message, {"role": "tool", "content": SUNNY, "tool_name": "get_weather"}]
    reply = client.chat(model=MODEL, messages=follow_up, tools=[WEATHER_TOOL], options=GREEDY)
    assert reply.message.content == SUNNY_REPLY and not reply.message.tool_calls


def test_format_constrains_the_answer(server):
    client, _ = server()
    schema = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}
    for format in ("json", schema):
        answer = client.chat(model=MODEL, messages=[{"role": "user", "content": UNIT}], format=format, options=GREEDY)
        assert json.loads(answer.message.content) == {"unit": "celsius"}
    # The reply the fake model would write ("Hello there!") is not JSON: the constraint changes it.
    constrained = client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], format=schema,
                              options=GREEDY | {"num_predict": 40})
    assert constrained.message.content != HELLO and constrained.message.content.startswith("{")


def test_embed_normalizes_and_embeddings_does_not(server):
    client, _ = server()
    texts = ["The first document.", "A second one."]
    answer = client.embed(model=MODEL, input=texts)
    assert answer.model == MODEL and answer.prompt_eval_count == sum(len(text) + 1 for text in texts)
    for vector, text in zip(answer.embeddings, texts):
        mean = fake_embedding_rows([BOS, *text.encode()]).astype(np.float64).mean(axis=0)
        assert len(vector) == FAKE_N_EMBD and np.allclose(vector, mean / np.linalg.norm(mean), atol=1e-6)
    older = client.embeddings(model=MODEL, prompt=texts[0])
    mean = fake_embedding_rows([BOS, *texts[0].encode()]).astype(np.float64).mean(axis=0)
    assert np.allclose(older.embedding, mean, atol=1e-5)


def test_the_model_is_listed_shown_and_running(server):
    client, base = server()
    assert post(base, "/api/version", None, method="GET") == (200, {"version": "0.12.0"})
    [listed] = client.list().models
    assert listed.model == MODEL and listed.size == 4_000_000 and listed.details.format == "gguf"
    assert listed.details.parameter_size == "1M" and listed.details.quantization_level == "F32"
    shown = client.show(MODEL)
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "fake"
    [loaded] = client.ps().models
    assert loaded.model == MODEL and loaded.context_length == 1024 and loaded.size_vram == 0
    assert client.show(f"{MODEL}:latest").details.family == "fake"


def test_errors_are_ollamas_shape(server):
    client, base = server()
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3", messages=[{"role": "user", "content": "Hi"}])
    assert missing.value.status_code == 404 and missing.value.error == "model 'llama3' not found"
    status, body = post(base, "/api/chat", {"model": MODEL, "messages": "Hi"})
    assert status == 400 and body == {"error": "'messages' must be a list of messages"}
    status, body = post(base, "/api/generate", {"model": MODEL, "prompt": "Hi", "template": "{{ .Prompt }}"})
    assert status == 400 and "'template' is not taken" in body["error"]
    status, body = post(base, "/api/chat", {"model": MODEL, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "tool", "content": "21 C", "tool_name": "get_weather"}]})
    assert status == 400 and "no call before it" in body["error"]


def test_the_key_is_asked_for(server):
    client, base = server(api_key="sekrit")
    assert client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], options=GREEDY).message.content
    status, _ = post(base, "/api/tags", None, method="GET")
    assert status == 401
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=base).list()
    assert refused.value.status_code == 401


def post(base: str, path: str, payload: dict | None, method: str = "POST") -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    body = None if payload is None else json.dumps(payload)
    connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data) if data else {}
