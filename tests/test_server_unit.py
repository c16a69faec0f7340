"""The HTTP server on the fake backend, spoken to with the real openai client: the protocol,
every error's status and shape, limits, the API key, disconnects and shutdown, in seconds."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading

import openai
import pytest

from helpers import serving, wait_until
from fakes import FakeBackend
from multiseq import FinishReason, Request, SamplingParams
from multiseq.server import ServerSettings, create_app

MODEL = "fake-model"
HI = "<user>Hi<assistant>"  # how the fake backend renders [{"role": "user", "content": "Hi"}]
REPLY = "Hello there, friend!"
USER_HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def server(make_runner, serve_app):
    """server(backend=None, autostart=True, **settings) -> (openai client, base URL, runner)."""
    def start(backend: FakeBackend | None = None, autostart: bool = True, **settings):
        backend = backend or FakeBackend(num_slots=4, window=256, n_batch=64, replies={HI: REPLY})
        runner = make_runner(backend, autostart=autostart)
        app = create_app(runner, ServerSettings(model_name=MODEL, **settings))
        base = serve_app(app)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=settings.get("api_key") or "unused", max_retries=0)
        return client, base, runner
    return start


def post(base: str, path: str, body: bytes | str, headers: dict | None = None) -> tuple[int, dict, dict]:
    """A raw POST: (status, JSON body, headers)."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data), dict(response.getheaders())


def get(base: str, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def assert_error_shape(body: dict, kind: str, param: str | None = None, code: str | None = None) -> None:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind and body["error"]["param"] == param and body["error"]["code"] == code
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]


# --- what works ----------------------------------------------------------------------------------

def test_chat_and_completions_answer_as_openai_does(server):
    client, _, _ = server()
    chat = client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0)
    assert chat.object == "chat.completion" and chat.model == MODEL and chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.content == REPLY and chat.choices[0].finish_reason == "stop"
    assert chat.usage.prompt_tokens == len(HI) + 1 and chat.usage.completion_tokens == len(REPLY) + 1  # + BOS, EOS
    completion = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0)
    assert completion.object == "text_completion" and completion.choices[0].text == "defgh"
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 5


def test_a_stream_gives_the_same_text_piece_by_piece_then_the_usage(server):
    client, _, _ = server()
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    # A piece per token, or fewer where the reader fell behind the engine (their pieces join).
    assert text == REPLY and 1 <= len([c for c in chunks if c.choices and c.choices[0].delta.content]) <= len(REPLY)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(REPLY) + 1
    assert all(chunk.usage is None for chunk in chunks[:-1])
    pieces = list(client.completions.create(model=MODEL, prompt="abc", max_tokens=4, temperature=0, stream=True))
    assert "".join(piece.choices[0].text for piece in pieces) == "defg"


def test_n_choices_and_logprobs_streamed_or_not(server):
    client, _, _ = server()
    both = client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0, n=2, logprobs=True,
                                          top_logprobs=2)
    assert [choice.index for choice in both.choices] == [0, 1]
    assert all(choice.message.content == REPLY for choice in both.choices)
    assert [entry.token for entry in both.choices[0].logprobs.content] == list(REPLY)
    assert all(len(entry.top_logprobs) == 2 for entry in both.choices[0].logprobs.content)
    streamed = [entry.token for chunk in client.chat.completions.create(
        model=MODEL, messages=USER_HI, temperature=0, logprobs=True, stream=True)
        for entry in (chunk.choices[0].logprobs.content or [] if chunk.choices and chunk.choices[0].logprobs else [])]
    assert streamed == list(REPLY)
    completion = client.completions.create(model=MODEL, prompt="abc", max_tokens=3, temperature=0, logprobs=1,
                                           stream=True)
    offsets = [offset for chunk in completion for offset in chunk.choices[0].logprobs.text_offset]
    assert offsets == [0, 1, 2]


def test_the_async_client_is_served_concurrently(server):
    _, base, runner = server(FakeBackend(num_slots=4, window=256, n_batch=64, decode_delay=0.002))

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        calls = [client.completions.create(model=MODEL, prompt=f"p{index}", max_tokens=6, temperature=0)
                 for index in range(8)]
        return [completion.choices[0].text for completion in await asyncio.gather(*calls)]

    assert len(asyncio.run(main())) == 8
    assert runner.stats().avg_seqs_per_decode_step > 1, "concurrent clients shared decode steps"


def test_models_health_and_metrics(server):
    client, base, runner = server()
    assert [model.id for model in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    list(client.completions.create(model=MODEL, prompt="abc", max_tokens=3, temperature=0, stream=True))
    assert get(base, "/health") == (200, b'{"status":"ok"}')
    status, data = get(base, "/metrics")
    metrics = data.decode()
    for name in ("multiseq_requests_running", "multiseq_requests_waiting", "multiseq_prompt_tokens_computed_total",
                 "multiseq_prompt_tokens_cached_total", "multiseq_generation_tokens_total",
                 "multiseq_time_to_first_token_seconds_bucket", "multiseq_inter_token_latency_seconds_bucket",
                 "multiseq_slot_occupancy", "multiseq_kv_tokens"):
        assert name in metrics
    assert f"multiseq_kv_capacity_tokens {float(runner.config.parallel * runner.window)}" in metrics
    assert 'multiseq_kv_cache_type{type_k="f16",type_v="f16"} 1.0' in metrics
    assert "multiseq_time_to_first_token_seconds_count 1.0" in metrics


def test_metrics_of_a_shared_kv_pool_count_cells_once_and_what_sharing_saves(make_runner, serve_app):
    backend = FakeBackend(num_slots=4, window=2048, n_batch=64, pool_size=2048)
    runner = make_runner(backend, autostart=False, kv_pool=2048)
    base = serve_app(create_app(runner, ServerSettings(model_name=MODEL)))
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    system = "You are a careful assistant who answers briefly. " * 4

    async def together() -> None:  # at once: the later prompts take the first one's cells in other slots
        asked = asyncio.gather(*(client.completions.create(model=MODEL, prompt=system + question, max_tokens=3,
                                                           temperature=0) for question in ("one", "two", "three")))
        while runner.num_waiting < 3:  # all three queued before anything runs, however fast this machine is
            await asyncio.sleep(0.01)
        runner.start()
        await asked

    asyncio.run(asyncio.wait_for(together(), 30))
    metrics = get(base, "/metrics")[1].decode()
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("multiseq_kv") and not line.startswith("#")}
    assert values["multiseq_kv_capacity_tokens"] == 2048
    assert values["multiseq_kv_shared_tokens"] > len(system) // 2, "a later prompt sits on the first one's cells"
    assert values["multiseq_kv_pool_cells_used"] == backend.num_cells_used
    assert values["multiseq_kv_tokens"] == values["multiseq_kv_pool_cells_used"] + values["multiseq_kv_shared_tokens"]
    assert values["multiseq_kv_pool_evictions_total"] == 0


def test_props_name_the_tool_call_family(server):
    _, base, _ = server()
    status, data = get(base, "/props")
    props = json.loads(data)
    assert status == 200 and props["model"] == MODEL and props["total_slots"] >= 1
    # The fake model's template knows no tools: the generic format, detected.
    assert props["tool_format"] == {"name": "generic", "description": props["tool_format"]["description"],
                                    "reasoning": None, "detected": "generic"}


def test_lora_adapters_are_listed_in_llama_servers_shape_and_kept_as_started(make_runner, serve_app):
    runner = make_runner(FakeBackend(num_slots=2, window=256, n_batch=64), lora=(("/m/style.gguf", 0.5),
                                                                                   ("/m/tone.gguf", 1.0)))
    base = serve_app(create_app(runner, ServerSettings(model_name=MODEL)))
    status, data = get(base, "/lora-adapters")
    assert status == 200 and json.loads(data) == [{"id": 0, "path": "/m/style.gguf", "scale": 0.5},
                                                  {"id": 1, "path": "/m/tone.gguf", "scale": 1.0}]
    status, body, _ = post(base, "/lora-adapters", json.dumps([{"id": 0, "scale": 0.2}]))
    assert status == 400 and "set when the server starts" in body["error"]["message"]


def test_health_is_503_while_the_model_loads(make_runner, serve_app):
    app = create_app(None, ServerSettings(model_name=MODEL))
    base = serve_app(app)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as loading:
        client.completions.create(model=MODEL, prompt="abc", max_tokens=2)
    assert loading.value.status_code == 503 and loading.value.response.headers["retry-after"]
    assert_error_shape(loading.value.body and {"error": loading.value.body}, "overloaded_error", code="model_loading")
    assert get(base, "/health")[0] == 503
    app.state.server.attach(make_runner(FakeBackend()))
    assert get(base, "/health")[0] == 200


# --- errors --------------------------------------------------------------------------------------

def test_a_missing_or_wrong_api_key_is_401_and_only_health_stays_open(server):
    client, base, _ = server(api_key="s3cret")
    assert client.completions.create(model=MODEL, prompt="abc", max_tokens=2).choices
    for key in ("wrong", "s3cre", "s3cret-and-more"):
        status, body, headers = post(base, "/v1/completions", json.dumps({"prompt": "abc"}),
                                     {"Authorization": f"Bearer {key}"})
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert_error_shape(body, "invalid_request_error", code="invalid_api_key")
    status, body, _ = post(base, "/v1/chat/completions", json.dumps({"messages": USER_HI}))
    assert status == 401
    assert get(base, "/health")[0] == 200
    assert get(base, "/metrics")[0] == 401, "the metrics are closed by default when there is a key"
    assert get(base, "/metrics", {"Authorization": "Bearer s3cret"})[0] == 200
    assert get(base, "/v1/no-such-route")[0] == 401, "an unknown route tells a stranger nothing"


def test_metrics_public_opens_only_the_metrics(server):
    _, base, _ = server(api_key="s3cret", metrics_public=True)
    assert get(base, "/metrics")[0] == 200 and get(base, "/v1/models")[0] == 401


def test_an_unknown_model_or_route_is_404(server):
    client, base, _ = server()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-nope", messages=USER_HI)
    assert_error_shape({"error": unknown.value.body}, "invalid_request_error", "model", "model_not_found")
    status, body, _ = post(base, "/v1/moderations", json.dumps({"input": "x"}))
    assert status == 404
    assert_error_shape(body, "not_found_error", code="unknown_url")


@pytest.mark.parametrize("body, param, words", [
    ("{not json", None, "not valid JSON"),
    ("[1, 2]", None, "JSON object"),
    ({"messages": USER_HI, "temperature": "hot"}, "temperature", "must be a number"),
    ({"messages": USER_HI, "top_p": 7}, "top_p", "top_p must be"),
    ({"messages": USER_HI, "tools": [{"type": "function"}]}, "tools[0].function", "must be an object"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "expected one of"),
    ({"prompt": "not a chat"}, "messages", "'messages' is required"),
    ({"messages": USER_HI, "stream": "yes"}, "stream", "true or false"),
    ({"messages": USER_HI, "stream_options": {"include_usage": True}}, "stream_options", "only allowed"),
    ({"messages": USER_HI, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
     "response_format", "cannot be compiled"),
])
def test_a_bad_body_is_400_naming_the_field(server, body, param, words):
    _, base, _ = server()
    status, answer, _ = post(base, "/v1/chat/completions", body if isinstance(body, str) else json.dumps(body))
    assert status == 400, answer
    assert_error_shape(answer, "invalid_request_error", param)
    assert words in answer["error"]["message"]


def test_a_prompt_that_cannot_fit_is_400_stating_the_numbers_and_max_tokens_is_capped(server):
    client, _, _ = server(FakeBackend(num_slots=2, window=64, n_batch=64))
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="x" * 80, max_tokens=4)
    assert "81 tokens" in too_long.value.body["message"] and "64 tokens" in too_long.value.body["message"]
    assert too_long.value.body["code"] == "context_length_exceeded"
    capped = client.completions.create(model=MODEL, prompt="x" * 20, max_tokens=60)  # 21 + 60 > 64
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == 64 - 21


def test_a_body_over_the_limit_is_413(server):
    _, base, _ = server(max_body_bytes=1000)
    status, body, _ = post(base, "/v1/completions", json.dumps({"prompt": "x" * 2000}))
    assert status == 413
    assert_error_shape(body, "invalid_request_error", code="request_too_large")


def test_a_full_queue_is_503_with_retry_after(server):
    client, base, runner = server(autostart=False, max_queue=2)  # nothing runs: requests stay queued
    answers = []
    waiting = [threading.Thread(target=lambda: answers.append(post(base, "/v1/completions", json.dumps(
        {"prompt": "abc", "max_tokens": 2})))) for _ in range(2)]
    for thread in waiting:
        thread.start()
    wait_until(lambda: runner.num_waiting == 2 or answers, what="two queued requests")
    assert not answers, f"a request that should wait was answered: {answers}"
    with pytest.raises(openai.APIStatusError) as busy:
        client.completions.create(model=MODEL, prompt="abc", max_tokens=2)
    assert busy.value.status_code == 503 and busy.value.response.headers["retry-after"] == "2"
    assert_error_shape({"error": busy.value.body}, "overloaded_error", code="queue_full")
    runner.start()
    for thread in waiting:
        thread.join(10)
    assert [status for status, _, _ in answers] == [200, 200]


def test_a_failure_inside_is_500_without_internals(server):
    backend = FakeBackend(num_slots=2)

    def broken(entries):
        raise RuntimeError("secret internal detail at /srv/model.gguf")

    backend.decode = broken
    _, base, _ = server(backend)
    status, body, _ = post(base, "/v1/completions", json.dumps({"prompt": "abc", "max_tokens": 3}))
    assert status == 500
    assert_error_shape(body, "server_error")
    assert "secret" not in json.dumps(body) and "/srv" not in json.dumps(body)


UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}  # the grammar cannot enforce uniqueItems


def schema_format(strict: bool | None = None) -> dict:
    spec = {"name": "numbers", "schema": UNIQUE} | ({} if strict is None else {"strict": strict})
    return {"type": "json_schema", "json_schema": spec}


def test_an_output_that_does_not_validate_is_422_streamed_or_not(server):
    """The fake writes [1,1] for this chat: the grammar lets it through (uniqueItems is
    approximated), the check after it does not, and the client sees an error, not content."""
    client, base, _ = server(FakeBackend(num_slots=2, replies={HI: "[1,1]", "<user>Two<assistant>": "[1,2]"}))
    with pytest.raises(openai.UnprocessableEntityError) as invalid:
        client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0, response_format=schema_format())
    assert_error_shape({"error": invalid.value.body}, "invalid_output_error", "response_format",
                       "output_does_not_validate")
    assert "non-unique elements" in invalid.value.body["message"] and "uniqueItems" in invalid.value.body["message"]
    events = list(client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0, stream=True,
                                                 response_format=schema_format()).response.iter_lines())
    errors = [json.loads(line[5:]) for line in events if line.startswith("data: {\"error\"")]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "output_does_not_validate" and events[-2] == "data: [DONE]"
    assert not any('"finish_reason": "stop"' in line for line in events), "no choice ends as a success"
    valid = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Two"}], temperature=0,
                                           response_format=schema_format())
    assert valid.choices[0].message.content == "[1,2]" and valid.model_extra["schema_approximated"] == ["uniqueItems"]
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Two"}],
                                                 temperature=0, stream=True, response_format=schema_format()))
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].model_extra["schema_approximated"] == [
        "uniqueItems"]


def test_strict_refuses_a_schema_it_cannot_enforce_with_400(server):
    client, _, _ = server()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=USER_HI, response_format=schema_format(strict=True))
    assert refused.value.body["param"] == "response_format" and "uniqueItems" in refused.value.body["message"]
    client, _, _ = server(defaults=SamplingParams(max_tokens=None, strict_schema=True))  # serve --strict-schema
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=USER_HI, response_format=schema_format())


# --- disconnects and shutdown ---------------------------------------------------------------------

def open_stream(base: str, body: dict) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                       headers={"Content-Type": "application/json"})
    return connection.getresponse()


def test_a_client_that_disconnects_mid_stream_is_cancelled_and_frees_its_slot(server):
    backend = FakeBackend(num_slots=1, window=512, decode_delay=0.005)
    _, base, runner = server(backend)
    finished = []
    runner_submit = runner.submit
    runner.submit = lambda request, **kwargs: runner_submit(request, **{**kwargs, "on_finish": _chain(
        kwargs.get("on_finish"), finished.append)})
    response = open_stream(base, {"prompt": "abc", "max_tokens": 400, "temperature": 0})
    assert response.status == 200 and response.readline().startswith(b"data: ")
    response.close()  # the client goes away mid-stream
    wait_until(lambda: finished)
    assert finished[0].finish_reason is FinishReason.CANCELLED and finished[0].completion_tokens < 400
    wait_until(lambda: runner.engine.scheduler.slots[0].is_free)
    follow = runner.submit(Request(prompt="next", sampling=SamplingParams(max_tokens=2, temperature=0)))
    assert follow.result(timeout=10).ok, "the slot serves the next request"


def test_a_client_that_disconnects_while_queued_is_cancelled_before_it_runs(server):
    backend = FakeBackend(num_slots=1, window=512, decode_delay=0.005)
    client, base, runner = server(backend)
    busy = open_stream(base, {"prompt": "first", "max_tokens": 300, "temperature": 0})
    assert busy.readline().startswith(b"data: ")
    queued = open_stream(base, {"prompt": "second", "max_tokens": 5})
    wait_until(lambda: runner.num_waiting == 1)
    queued.close()
    wait_until(lambda: runner.num_waiting == 0)
    busy.close()
    wait_until(lambda: runner.engine.scheduler.slots[0].is_free)
    prefilled = [prompt for prompt in backend.prompts if prompt]
    assert all(bytes(token for token in prompt if token < 256) != b"second" for prompt in prefilled)
    assert runner.engine.stats.finished_by_reason["cancelled"] == 2


def test_stopping_the_server_ends_running_streams_cleanly(make_runner):
    backend = FakeBackend(num_slots=2, window=512, decode_delay=0.005)
    runner = make_runner(backend)
    app = create_app(runner, ServerSettings(model_name=MODEL))
    lines = []
    with serving(app) as base:
        stream = open_stream(base, {"prompt": "abc", "max_tokens": 400})
        lines.append(stream.readline())
        app.state.server.begin_shutdown()  # what SIGINT or SIGTERM do
        lines += stream.read().splitlines()
    events = [line for line in lines if line.startswith(b"data: ")]
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "shutting_down"
    assert events[-1] == b"data: [DONE]"


def _chain(first, second):
    def both(value):
        if first is not None:
            first(value)
        second(value)
    return both


def test_a_conversation_restored_from_ram_says_so_in_its_usage_and_in_the_metrics(server):
    system = {"role": "system", "content": "You answer questions about the weather, briefly. " * 2}
    first = [system, {"role": "user", "content": "Is it raining in Paris today?"}]
    other = [system, {"role": "user", "content": "Will it snow in Oslo tomorrow?"}]
    client, base, _ = server(FakeBackend(num_slots=1, window=512, n_batch=64))
    reply = client.chat.completions.create(model=MODEL, messages=first, max_tokens=8, temperature=0)
    client.chat.completions.create(model=MODEL, messages=other, max_tokens=8, temperature=0)  # takes the one slot
    follow_up = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "And in Lyon?"}]
    again = client.chat.completions.create(model=MODEL, messages=follow_up, max_tokens=8, temperature=0)
    details = again.usage.prompt_tokens_details
    assert details.cached_tokens_from_ram == details.cached_tokens > len(system["content"])
    metrics = get(base, "/metrics")[1].decode()
    assert "multiseq_ram_cache_restores_total 1.0" in metrics
    assert f"multiseq_prompt_tokens_from_ram_total {float(details.cached_tokens)}" in metrics
    assert "multiseq_ram_cache_entries" in metrics and "multiseq_ram_cache_bytes" in metrics
