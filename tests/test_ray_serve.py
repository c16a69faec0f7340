"""`serve --ray` and multiseq.ray_serve: two replicas of the bundled model (one thread each) on a
local Ray, behind Ray Serve's proxy on a free loopback port. The command, on Ray Serve's own
router, spreads requests sent together over both replicas. Routed by prefix, each session's
turns stay on one replica (whose cache then holds them), sessions spread, every API and streams pass through,
/health and /metrics cover the replicas, and a replica killed mid-stream ends that stream with
an error event while new requests go to the other and Ray Serve starts it again."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'multiseq[ray]')")
serve = pytest.importorskip("ray.serve")

import anthropic  # noqa: E402
import openai  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from helpers import read_until, wait_until  # noqa: E402
from multiseq import RunnerConfig  # noqa: E402
from multiseq import ray_serve  # noqa: E402
from multiseq.ray_serve import gateway as ray_serve_gateway, relay as ray_serve_relay  # noqa: E402
from multiseq.ray_serve.calls import SHARE_GRACE_S, PrefixAsk  # noqa: E402
from multiseq.server.app import ServerSettings  # noqa: E402

MODEL = "smollm2-135m"
NUM_REPLICAS = 2
SYSTEM = {"role": "system", "content": "You are a terse assistant for a weather service. " * 8}
READY = re.compile(r"serving (http://127\.0\.0\.1:\d+)/v1")
# A replica killed mid-stream: the stream ends within this; a new replica is up within the other.
STREAM_END_S = 10
RESTART_S = 90

model = pytest.mark.model


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- as a user runs it ---------------------------------------------------------------------------

@model
@pytest.mark.skipif((os.cpu_count() or 1) < NUM_REPLICAS,
                    reason="two replicas of one thread need two cores (the command will not make them share one)")
def test_serve_on_ray_spreads_requests_over_the_replicas_with_rays_routing_and_stops_on_sigterm(start_cli, tmp_path):
    """The command with its own local Ray and two replicas on Ray Serve's own router (power of
    two choices by queue length; the module's cluster below routes by prefix): requests sent
    together are served by both replicas, as each replica's /metrics counts too, a stream passes
    through, a file's calls still go to the replica that keeps it, and SIGTERM stops it all."""
    process = start_cli("serve", "--ray", "--replicas", str(NUM_REPLICAS), "--routing", "ray", "-m", MODEL,
                        "-np", "1", "-t", "1", "-c", "512", "--port", "0", "--no-dashboard", "--alias", "local",
                        "--data-dir", str(tmp_path))
    lines = read_until(process, "ready:", timeout=120)
    assert "routing ray" in lines[-1]
    base = next(match.group(1) for line in lines if (match := READY.search(line)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

    def ask(index: int):
        return client.chat.completions.with_raw_response.create(
            model="local", max_tokens=4, temperature=0, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": f"Hi number {index}"}])

    served: dict[str, int] = {}  # replica: chat requests it answered
    with ThreadPoolExecutor(4) as pool:
        for attempt in range(5):  # sent together, they spread (each goes to the shorter of two queues)
            for raw in pool.map(ask, range(4 * attempt, 4 * attempt + 4)):
                completion = raw.parse()
                assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 4
                assert completion.choices[0].message.content
                served[raw.headers["x-multiseq-replica"]] = served.get(raw.headers["x-multiseq-replica"], 0) + 1
            if len(served) == NUM_REPLICAS:
                break
    assert len(served) == NUM_REPLICAS, f"twenty requests sent four at a time all went to {served}"

    raw = client.chat.completions.with_raw_response.create(
        model="local", max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}, messages=[{"role": "user", "content": "Hi"}])
    assert raw.headers["content-type"].startswith("text/event-stream") and raw.headers["x-multiseq-replica"] in served
    served[raw.headers["x-multiseq-replica"]] += 1
    chunks = list(raw.parse())
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6

    health = _health(base)
    assert health["status"] == "ok" and set(health["replicas"]) == set(served), (health, served)
    counted = {sample.labels["replica"]: int(sample.value)
               for family in text_string_to_metric_families(_get(base, "/metrics")[1])
               for sample in family.samples
               if sample.name == "multiseq_api_requests_total" and sample.labels.get("api") == "chat"}
    assert counted == served, "each replica's /metrics counts the requests its header named"

    uploaded = client.files.create(file=("in.jsonl", b'{"custom_id": "a"}\n'), purpose="batch")
    homes = {client.files.with_raw_response.retrieve(uploaded.id).headers["x-multiseq-replica"] for _ in range(4)}
    assert len(homes) == 1, "a file's calls go to the replica that keeps it, not the shorter queue"

    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=60)
    assert process.returncode == 0, rest
    assert "multiseq serve stopped" in rest and "Traceback" not in "".join(lines) + rest


@model
def test_serve_on_ray_serves_several_models_on_each_replica(start_cli):
    """`-m` twice with --ray: one replica serves both models, each picked by a request's model,
    and the page's /status behind the gateway names both, with their replica."""
    process = start_cli("serve", "--ray", "--replicas", "1", "-m", MODEL, "-m", "gemma3-270m", "-np", "1", "-t", "1",
                        "-c", "512", "--port", "0", "--no-dashboard")
    lines = read_until(process, "ready:", timeout=180)
    assert f"{MODEL}, gemma3-270m on 1 Ray Serve replicas" in lines[-1]
    base = next(match.group(1) for line in lines if (match := READY.search(line)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    for name in (MODEL, "gemma3-270m"):
        completion = client.chat.completions.create(model=name, max_tokens=3, temperature=0,
                                                    extra_body={"ignore_eos": True},
                                                    messages=[{"role": "user", "content": "Hi"}])
        assert completion.model == name and completion.usage.completion_tokens == 3
    state = json.loads(_get(base, "/status")[1])
    assert [(model["name"], model["status"]) for model in state["models"]] == [(MODEL, "loaded"),
                                                                               ("gemma3-270m", "loaded")]
    assert len({model["replica"] for model in state["models"]}) == 1
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=60)
    assert process.returncode == 0 and "Traceback" not in "".join(lines) + rest


def test_ray_options_without_ray_or_with_the_dashboard_are_usage_errors(run_cli):
    for args, words in ((["--replicas", "2"], "--replicas needs --ray"), (["--routing", "ray"], "--routing needs --ray"),
                        (["--no-share-prefixes"], "--no-share-prefixes needs --ray"),
                        (["--ray", "--dashboard"], "--dashboard shows the slots of one server")):
        result = run_cli("serve", "--port", "0", *args)
        assert result.exit_code == 2 and words in result.output


# --- two replicas --------------------------------------------------------------------------------

@pytest.fixture(scope="session")  # under pytest-xdist a module's fixtures may be set up again mid-module
def base_url(ray_cluster, tmp_path_factory):
    """The tests' local Ray (conftest: a CPU for each replica and one spare, for an application
    that cannot start), the application on Ray Serve's proxy at a free port."""
    assert ray.cluster_resources()["CPU"] == NUM_REPLICAS + 1
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RunnerConfig(model=MODEL, parallel=2, threads=1, slot_ctx=1024, seed=0)
        settings = ServerSettings(model_name=MODEL, data_dir=tmp_path_factory.mktemp("data"))
        serve.run(ray_serve.build_app(config, settings, NUM_REPLICAS), name=ray_serve.APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


@pytest.fixture
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def chat(client, messages: list[dict]):
    """One greedy turn; its reply, the replica it ran on and the prompt tokens it found cached."""
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=8,
                                                           temperature=0)
    completion = raw.parse()
    return completion.choices[0].message.content, raw.headers["x-multiseq-replica"], \
        completion.usage.prompt_tokens_details.cached_tokens


@model
def test_each_session_stays_on_one_replica_and_sessions_spread(client):
    replicas_by_session, cached_by_turn = {}, []
    for session in range(3):
        history = [SYSTEM]
        for turn in range(3):
            history.append({"role": "user", "content": f"Session {session}: the weather in town {turn}?"})
            reply, replica, cached = chat(client, history)
            history.append({"role": "assistant", "content": reply})
            replicas_by_session.setdefault(session, []).append(replica)
            cached_by_turn.append((turn, cached))
    assert all(len(set(replicas)) == 1 for replicas in replicas_by_session.values()), replicas_by_session
    assert len({replicas[0] for replicas in replicas_by_session.values()}) == NUM_REPLICAS, "sessions spread"
    history_lengths = {turn: cached for turn, cached in cached_by_turn if turn > 0}
    assert all(cached > 0 for cached in history_lengths.values()), "later turns find their history cached"


def test_a_replica_asked_for_a_prefix_waits_for_what_is_coming_and_no_longer_than_the_askers_own_cost():
    """The rule a replica answers a prefix ask by (no model): a prefill under way is waited for
    while it goes forward; a request still on its way or being prepared, on a busy machine,
    for up to the asker's own cost; what is already held, not at all."""
    ask = PrefixAsk(np.arange(200, dtype=np.int32), more_than=100, patience_s=2.0, replica="r")
    assert not ask.keeps_waiting(150, is_growing=False, num_coming=0, waited_s=0.0, stalled_s=0.0), "held: answered now"
    assert ask.keeps_waiting(0, is_growing=True, num_coming=0, waited_s=5.0, stalled_s=1.9), "goes forward"
    assert not ask.keeps_waiting(0, is_growing=True, num_coming=0, waited_s=5.0, stalled_s=2.0), "stalled too long"
    # The request the router sent there has not arrived yet, or is being rendered on a busy CPU.
    assert ask.keeps_waiting(0, is_growing=False, num_coming=0, waited_s=0.0, stalled_s=0.0)
    assert not ask.keeps_waiting(0, is_growing=False, num_coming=0, waited_s=SHARE_GRACE_S, stalled_s=0.0)
    assert ask.keeps_waiting(0, is_growing=False, num_coming=1, waited_s=1.5, stalled_s=1.5)
    assert not ask.keeps_waiting(0, is_growing=False, num_coming=1, waited_s=2.0, stalled_s=2.0)


@model
def test_a_session_on_the_other_replica_brings_the_shared_system_prompt_over(client, base_url):
    """Two new sessions sharing a system prompt, sent together, go to the two replicas; the
    second replica waits for the first one's prefill of the shared prompt and restores its KV
    (into host memory) instead of computing it again. Without sharing, neither finds anything."""
    for attempt in range(3):  # sent together, they spread (the router counts each pick at once)
        system = {"role": "system", "content": f"You are a patient assistant for railway {attempt}. " * 12}
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda city: client.chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=4, temperature=0,
                messages=[system, {"role": "user", "content": f"Trains to {city}?"}]), ["Leeds", "York"]))
        if len({answer.headers["x-multiseq-replica"] for answer in answers}) == NUM_REPLICAS:
            break
    else:
        pytest.fail("two sessions sent together went to one replica, three times")
    usages = [answer.parse().usage for answer in answers]
    brought = max(range(2), key=lambda index: usages[index].prompt_tokens_details.cached_tokens)
    assert usages[brought].prompt_tokens_details.cached_tokens >= 0.8 * usages[brought].prompt_tokens, \
        "the system prompt came from the other replica"
    replica = answers[brought].headers["x-multiseq-replica"]
    imports = re.search(rf'multiseq_ram_cache_imports_total{{replica="{re.escape(replica)}"}} (\S+)',
                        _get(base_url, "/metrics")[1])
    assert imports and float(imports.group(1)) >= 1, "counted in the replica's metrics"


@model
def test_streams_and_the_other_apis_pass_through(base_url):
    connection = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "ignore_eos": True,
         "stream": True,
         "stream_options": {"include_usage": True}}), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    assert response.getheader("x-multiseq-replica")
    events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["usage"]["completion_tokens"] == 6
    message = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0).messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}], extra_body={"ignore_eos": True})
    assert message.content[0].text and message.usage.output_tokens == 4 and message.stop_reason == "max_tokens"
    models = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused").models.list()
    assert [card.id for card in models.data] == [MODEL]


@model
def test_files_are_always_read_from_the_replica_that_keeps_them(client):
    uploaded = client.files.create(file=("in.jsonl", b'{"custom_id": "a"}\n'), purpose="batch")
    replicas = set()
    for _ in range(4):
        raw = client.files.with_raw_response.retrieve(uploaded.id)
        assert raw.parse().id == uploaded.id
        replicas.add(raw.headers["x-multiseq-replica"])
    assert len(replicas) == 1


@model
def test_a_stored_response_is_continued_on_the_replica_that_keeps_it(client):
    """Stored responses live on the replica that made them (one made by a stream too): every
    request naming one goes there, where a replica chosen by load would not find it."""
    raw = client.responses.with_raw_response.create(model=MODEL, input="Name a city.", max_output_tokens=8,
                                                    stream=True)
    home = raw.headers["x-multiseq-replica"]
    events = list(raw.parse())
    first_id = next(event.response.id for event in events if event.type == "response.created")
    previous_id = first_id
    for question in ("And another?", "And one more?", "Which is largest?"):
        raw = client.responses.with_raw_response.create(model=MODEL, input=question, max_output_tokens=8,
                                                        previous_response_id=previous_id)
        assert raw.headers["x-multiseq-replica"] == home
        previous_id = raw.parse().id
    raw = client.responses.with_raw_response.retrieve(first_id)
    assert raw.parse().id == first_id and raw.headers["x-multiseq-replica"] == home


@model
def test_health_and_metrics_cover_every_replica(base_url, client):
    chat(client, [{"role": "user", "content": "Hi"}])
    health = json.loads(_get(base_url, "/health")[1])
    assert health["status"] == "ok" and len(health["replicas"]) == NUM_REPLICAS
    assert all(replica["status"] == "ok" for replica in health["replicas"].values())
    status, metrics = _get(base_url, "/metrics")
    assert status == 200
    for name in health["replicas"]:
        assert f'multiseq_replica_up{{replica="{name}"}} 1.0' in metrics
        assert re.search(rf'multiseq_requests_waiting{{replica="{name}"}} ', metrics), metrics[:2000]
    assert metrics.count("# TYPE multiseq_requests_waiting gauge") == 1, "each family once"


@model
def test_a_client_that_goes_away_frees_its_slot_on_the_replica(base_url):
    connection = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 900,
         "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})  # ~10 s to run out
    response = connection.getresponse()
    for _ in range(10):  # a few tokens: it holds a slot
        response.readline()
    assert _num_running(base_url) == 1
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    wait_until(lambda: _num_running(base_url) == 0, timeout=3, what="the slot freed")


def _num_running(base_url: str) -> int:
    return sum(int(float(line.split()[-1])) for line in _get(base_url, "/metrics")[1].splitlines()
               if line.startswith("multiseq_requests_running{"))


@model
def test_a_killed_replica_ends_its_stream_with_an_error_and_the_others_serve_on(base_url, client):
    connection = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 400,
         "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
    response = connection.getresponse()
    victim = response.getheader("x-multiseq-replica")
    assert response.readline().startswith(b"data: ")  # it is streaming
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{ray_serve.APP_NAME}#{ray_serve.ENGINE}#{victim}", namespace="serve"),
             no_restart=True)
    killed_at = time.monotonic()
    rest = response.read().decode()
    assert time.monotonic() - killed_at < STREAM_END_S
    events = [line for line in rest.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == "replica_lost"

    _, replica, _ = chat(client, [{"role": "user", "content": "Still there?"}])
    assert replica != victim
    wait_until(lambda: _health(base_url)["status"] == "ok", timeout=RESTART_S, what="a new replica")
    assert victim not in _health(base_url)["replicas"] and len(_health(base_url)["replicas"]) == NUM_REPLICAS


def _get(base_url: str, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read().decode()


def _health(base_url: str) -> dict:
    return json.loads(_get(base_url, "/health")[1])


@model
def test_a_cluster_too_small_is_one_line(base_url, ray_cluster, run_cli):
    result = run_cli("serve", "--ray", ray_cluster, "--replicas", "4", "-t", "1",
                     "--port", "0")
    assert result.exit_code == 1
    assert "4 replicas x 1 threads need 4 CPUs, and the Ray cluster has 3: use fewer --replicas" in result.output
    assert "Traceback" not in result.output


@model
def test_a_replica_whose_model_cannot_load_is_one_line_and_the_others_serve_on(client, tmp_path):
    """On a cluster, the model file can be missing or broken on a replica's node: starting
    the application then fails with llama.cpp's reason in one line, not a hang."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    config = RunnerConfig(model=str(broken), parallel=1, threads=1, slot_ctx=256)
    app = ray_serve.build_app(config, ServerSettings(model_name="broken"), 1)
    try:
        with pytest.raises(ray_serve.RayServeError) as failure:
            ray_serve.start_application(app, name="broken", route_prefix="/broken")
    finally:
        serve.delete("broken")
    assert str(failure.value).startswith("the application could not start: the model could not load: ")
    assert "bad GGUF version" in str(failure.value) and "\n" not in str(failure.value)
    assert chat(client, [{"role": "user", "content": "Hi"}])[0], "the running application answers on"


# --- what the gateway does, without a cluster -----------------------------------------------------

class Sent:
    """An ASGI `send` that keeps what it was sent."""

    def __init__(self) -> None:
        self.messages = []

    async def __call__(self, message) -> None:
        self.messages.append(message)

    @property
    def body(self) -> str:
        return b"".join(message.get("body", b"") for message in self.messages).decode()


def relayed_then_failed(path: str, batches: list[list[dict]]) -> Sent:
    """A replica's messages through the gateway's relay, then the replica dies."""
    import asyncio

    sent = Sent()

    async def run() -> None:
        relay = ray_serve_relay.Relay(sent, path)
        for batch in batches:
            await relay.forward(batch)
        await relay.fail()

    asyncio.run(run())
    return sent


ACCEPTED = [{"type": "multiseq.accepted", "replica": "r1"}]
STREAM_START = [{"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]}]


def test_a_stream_cut_by_its_replica_ends_with_the_apis_error_event():
    chat = relayed_then_failed("/v1/chat/completions", [ACCEPTED, STREAM_START, [
        {"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True}]])
    assert (b"x-multiseq-replica", b"r1") in chat.messages[0]["headers"]
    events = [line for line in chat.body.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["error"]["code"] == "replica_lost"
    assert chat.messages[-1]["more_body"] is False

    messages = relayed_then_failed("/v1/messages", [ACCEPTED, STREAM_START])
    assert "event: error" in messages.body and json.loads(messages.body.split("data: ")[-1])["type"] == "error"

    responses = relayed_then_failed("/v1/responses", [ACCEPTED, STREAM_START, [
        {"type": "http.response.body", "body": b'event: response.created\ndata: {"sequence_number": 4}\n\n',
         "more_body": True}]])
    error = json.loads(responses.body.split("data: ")[-1])
    assert error["type"] == "error" and error["code"] == "replica_lost" and error["sequence_number"] == 5


def test_a_request_whose_replica_died_before_answering_gets_a_502():
    sent = relayed_then_failed("/v1/chat/completions", [ACCEPTED])
    assert sent.messages[0]["status"] == 502
    assert json.loads(sent.body)["error"]["code"] == "replica_lost"
    anthropic_shape = relayed_then_failed("/v1/messages", [ACCEPTED])
    assert json.loads(anthropic_shape.body)["type"] == "error"


def test_metrics_of_the_replicas_merge_into_one_exposition_with_a_label_each():
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    def exposition(tokens: int) -> str:
        registry = CollectorRegistry()
        Counter("multiseq_generation_tokens", "Tokens generated", registry=registry).inc(tokens)
        Histogram("multiseq_ttft_seconds", "TTFT", buckets=(0.1, 1.0), registry=registry).observe(0.5)
        return generate_latest(registry).decode()

    merged = ray_serve_gateway.merge_metrics({"a": exposition(5), "b": exposition(7), "c": None}).decode()
    assert merged.count("# TYPE multiseq_generation_tokens_total counter") == 1
    assert merged.count("# TYPE multiseq_ttft_seconds histogram") == 1
    assert 'multiseq_generation_tokens_total{replica="a"} 5.0' in merged
    assert 'multiseq_generation_tokens_total{replica="b"} 7.0' in merged
    assert 'multiseq_ttft_seconds_bucket{le="1.0",replica="b"} 1.0' in merged
    assert 'multiseq_replica_up{replica="c"} 0.0' in merged and 'multiseq_replica_up{replica="a"} 1.0' in merged


def test_health_is_degraded_while_a_replica_is_missing_or_failing():
    assert ray_serve_gateway.health_report({"a": "ok", "b": "ok"}, 2)["status"] == "ok"
    assert ray_serve_gateway.health_report({"a": "ok"}, 2)["status"] == "degraded"
    assert ray_serve_gateway.health_report({"a": "ok", "b": None}, 2)["replicas"]["b"] == {"status": "unreachable"}
    assert ray_serve_gateway.health_report({"a": "loading"}, 2)["status"] == "unavailable"
    assert ray_serve_gateway.health_report({}, 2)["status"] == "loading"


@model
def test_the_pages_state_covers_every_replica(base_url):
    status, text = _get(base_url, "/status")
    state = json.loads(text)
    assert status == 200 and len({model["replica"] for model in state["models"]}) == NUM_REPLICAS
    assert all(model["status"] == "loaded" and model["slots"] for model in state["models"])
    connection = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=30)
    connection.request("GET", "/status/events")
    response = connection.getresponse()
    assert response.status == 200
    first = json.loads(response.readline().decode().removeprefix("data: "))
    assert len(first["models"]) == NUM_REPLICAS
    connection.close()


def test_the_replicas_page_states_merge_into_one():
    from multiseq.ray_serve.status import merge_status

    def state(at: float, tokens_per_s: float, ttft_s: float | None, requests: int, error_at: float) -> dict:
        return {"at": at, "started_at": at - 100, "api_key_required": False, "requests_by_api": {"chat": 2},
                "models": [{"name": MODEL, "status": "loaded", "slots": []}],
                "history": [{"at": at - 0.5, "tokens_per_s": tokens_per_s, "ttft_s": ttft_s, "requests": requests}],
                "errors": [{"at": error_at, "status": 400, "route": "POST /v1/chat/completions", "api": "chat",
                            "message": "bad"}]}

    merged = merge_status({"b": state(1001.0, 30.0, 0.4, 1, 5.0), "a": state(1000.6, 10.0, 0.1, 3, 9.0), "c": None})
    assert [(model["name"], model["replica"]) for model in merged["models"]] == [(MODEL, "a"), (MODEL, "b"), ("?", "c")]
    assert merged["models"][2]["status"] == "failed" and "c did not answer" in merged["models"][2]["failure"]
    assert merged["requests_by_api"] == {"chat": 4} and merged["started_at"] == 900.6
    (point,) = merged["history"]  # both samples fall in the same 2-second interval
    assert point["tokens_per_s"] == 40.0 and point["requests"] == 4 and abs(point["ttft_s"] - 0.175) < 1e-9
    assert [error["replica"] for error in merged["errors"]] == ["b", "a"]


def test_a_responses_home_is_noted_before_its_id_reaches_the_client():
    """A client that continues a response the moment its id arrives finds it on its replica:
    the gateway notes the home as the id passes, not once the whole answer went out (a
    continuation sent at once went to the other replica, which does not keep it: a 404)."""
    import asyncio

    noted, sent = [], []

    async def send(message):
        sent.append((message["type"], list(noted)))

    async def relay_it():
        relay = ray_serve_relay.Relay(send, "/v1/responses", on_response_id=lambda *home: noted.append(home))
        await relay.forward([*ACCEPTED, {"type": "http.response.start", "status": 200, "headers": []}])
        await relay.forward([{"type": "http.response.body", "more_body": True,
                              "body": b'event: response.created\ndata: {"response": {"id": "resp_abc"}}\n\n'}])

    asyncio.run(relay_it())
    assert sent[-1] == ("http.response.body", [("resp_abc", "r1")])
