"""The server's page on the fake backend: GET / serves it (its own files, a strict
Content-Security-Policy, nothing from elsewhere), GET /status says what every slot holds (the
request's API and client, its phase and tokens), the queue and the recent errors, and
/status/events pushes one state built per change to every page listening. With --api-key only
the page's own files come without the key; --no-webui turns the page off."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
import time
from types import SimpleNamespace

import pytest

from fakes import FakeBackend
from helpers import wait_until
from multiseq import Request, SamplingParams
from multiseq.server import ServerSettings, create_app
from multiseq.server.metrics import ServerMetrics
from multiseq.server.monitor import Monitor
from multiseq.server.page import CONTENT_SECURITY_POLICY, FILES
from test_server_unit import assert_error_shape, get, post

PAGE_FILES = ("/", "/page/app.js", "/page/app.css")
LONG_CHAT = {"messages": [{"role": "user", "content": "Count for me."}], "max_tokens": 100_000, "ignore_eos": True,
             "stream": True}


@pytest.fixture
def page_server(make_runner, serve_app):
    def start(num_slots: int = 2, **settings):
        runner = make_runner(FakeBackend(num_slots=num_slots, window=200_000, n_batch=64))
        return serve_app(create_app(runner, ServerSettings(model_name="fake", **settings))), runner
    return start


def get_full(base: str, path: str, headers: dict | None = None) -> tuple[int, bytes, dict]:
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data, {name.lower(): value for name, value in response.getheaders()}


def status(base: str, headers: dict | None = None) -> dict:
    code, data = get(base, "/status", headers)
    assert code == 200, data
    return json.loads(data)


def stream_in_background(base: str, body: dict, headers: dict | None = None) -> threading.Thread:
    """A streamed chat read to its end on a thread of its own (the test cancels it)."""
    def read() -> None:
        host, port = base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json", "User-Agent": "page-test/1.0", **(headers or {})})
        connection.getresponse().read()
        connection.close()
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_the_page_is_served_with_its_own_files_only(page_server):
    base, _ = page_server()
    code, html, headers = get_full(base, "/")
    assert code == 200 and headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "connect-src 'self'" in CONTENT_SECURITY_POLICY
    assert headers["x-content-type-options"] == "nosniff"
    total = 0
    for path, name in zip(PAGE_FILES, FILES):
        code, data, headers = get_full(base, path)
        assert code == 200 and headers["content-type"] == FILES[name], path
        total += len(data)
        text = data.decode()
        # Nothing fetched from elsewhere: the only absolute URL is SVG's namespace, a name.
        assert set(re.findall(r"https?://[^\s\"'`)]+", text)) <= {"http://www.w3.org/2000/svg"}, path
        assert "<script>" not in text and "onclick" not in text  # no inline script: the policy would block it
    assert total < 100_000
    code, data = get(base, "/page/../state.py")
    assert code == 404
    assert get(base, "/page/secret.txt")[0] == 404


def test_status_names_each_slots_request_its_api_and_client_and_the_queue(page_server):
    base, runner = page_server(num_slots=1)
    stream_in_background(base, LONG_CHAT)
    wait_until(lambda: status(base)["models"][0]["slots"][0]["phase"] == "decode", what="the chat decoding")
    queued = runner.submit(Request(prompt="waits", sampling=SamplingParams(max_tokens=4)))
    wait_until(lambda: status(base)["models"][0]["queue"], what="the queue shown")
    model = status(base)["models"][0]
    (slot,) = model["slots"]
    assert slot["api"] == "chat" and slot["client"].startswith("127.0.0.1:") and slot["client"].endswith("page-test/1.0")
    assert slot["request_id"].startswith("chatcmpl-") and slot["generated_tokens"] > 0 and slot["kv_cells"] > 0
    assert slot["prompt_tokens"] == slot["cached_tokens"] + slot["computed_tokens"]
    assert model["queue"][0]["request_id"] == queued.id and model["queue"][0]["phase"] == "queued"
    assert model["queue"][0]["api"] == "batch"  # not from an HTTP route: the engine's own caller
    assert model["num_running"] == 1 and model["num_waiting"] == 1 and model["kv"]["cells_used"] > 0
    runner.cancel_all()
    wait_until(lambda: status(base)["models"][0]["slots"][0]["phase"] == "idle", what="the slot idle")
    # The stream went out as a 200 and ended with an error event: listed with the errors, as told.
    wait_until(lambda: status(base)["errors"], what="the stream's error listed")
    (error,) = status(base)["errors"]
    assert error["status"] == 503 and error["route"] == "POST /v1/chat/completions" and "cancelled" in error["message"]


def test_status_keeps_the_recent_errors_as_the_clients_were_told(page_server):
    base, _ = page_server()
    code, body, _ = post(base, "/v1/chat/completions", json.dumps({"messages": "not a list"}))
    assert code == 400
    (error,) = status(base)["errors"]
    assert error["status"] == 400 and error["route"] == "POST /v1/chat/completions" and error["api"] == "chat"
    assert error["message"] == body["error"]["message"]


def test_the_api_key_guards_everything_but_the_pages_own_files(page_server):
    base, _ = page_server(api_key="sesame")
    for path in PAGE_FILES:
        assert get(base, path)[0] == 200, path
    for path in ("/status", "/status/events", "/v1/models"):
        code, data = get(base, path)
        assert code == 401, path
        assert_error_shape(json.loads(data), "invalid_request_error", code="invalid_api_key")
    assert status(base, {"Authorization": "Bearer sesame"})["api_key_required"] is True
    # A foreign site's page cannot read the state, even with the key.
    code, _ = get(base, "/status", {"Authorization": "Bearer sesame", "Origin": "http://evil.example"})
    assert code == 403


def test_no_webui_turns_the_page_off_and_leaves_the_status(page_server):
    base, _ = page_server(api_key="sesame", webui=False)
    assert get(base, "/")[0] == 401  # an unknown path wants the key too: nothing is learned without it
    assert get(base, "/", {"Authorization": "Bearer sesame"})[0] == 404
    assert get(base, "/page/app.js", {"Authorization": "Bearer sesame"})[0] == 404
    assert status(base, {"Authorization": "Bearer sesame"})["models"][0]["name"] == "fake"


def test_events_stream_the_state_to_a_page(page_server):
    base, runner = page_server()
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request("GET", "/status/events")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    first = json.loads(response.readline().decode().removeprefix("data: "))
    assert first["models"][0]["status"] == "loaded"
    runner.run_batch([Request(prompt="abc", sampling=SamplingParams(max_tokens=3))])
    seen = []
    while not any(model["finished"]["succeeded"] for model in seen):
        line = response.readline().decode()
        if line.startswith("data: "):
            seen = json.loads(line.removeprefix("data: "))["models"]
    connection.close()


# --- the monitor alone: one state built per change, however many pages ------------------------

class _Models(list):
    pass


def _fake_model(snapshot) -> SimpleNamespace:
    runner = SimpleNamespace(latest_snapshot=snapshot, failure=None, device=None, window=64, num_waiting=0)
    return SimpleNamespace(name="m", status="loaded", told_failure=None, runner=runner)


def test_one_state_is_built_per_change_for_every_page(make_runner):
    runner = make_runner(FakeBackend(num_slots=2, window=64, n_batch=16))
    model = _fake_model(runner.latest_snapshot)
    monitor = Monitor(_Models([model]), ServerMetrics(lambda: None), api_key_required=False)

    async def pages() -> None:
        streams = [monitor.events() for _ in range(4)]
        firsts = [await anext(stream) for stream in streams]
        assert len(set(firsts)) == 1 and monitor.num_built == 1  # four pages, one state
        assert not monitor.refresh()  # nothing changed: nothing built
        runner.run_batch([Request(prompt="abc", sampling=SamplingParams(max_tokens=3))])
        model.runner.latest_snapshot = runner.latest_snapshot
        nexts = [asyncio.ensure_future(anext(stream)) for stream in streams]
        await asyncio.sleep(0)
        assert monitor.refresh() and monitor.num_built == 2
        payloads = await asyncio.gather(*nexts)
        assert len(set(payloads)) == 1 and json.loads(payloads[0].removeprefix("data: "))["models"][0]["finished"]["succeeded"] == 1
        for stream in streams:
            await stream.aclose()

    asyncio.run(pages())


def test_the_history_samples_throughput_and_time_to_first_token(make_runner):
    runner = make_runner(FakeBackend(num_slots=2, window=64, n_batch=16))
    model = _fake_model(runner.latest_snapshot)
    metrics = ServerMetrics(lambda: None)
    monitor = Monitor(_Models([model]), metrics, api_key_required=False)
    monitor.sample()
    runner.run_batch([Request(prompt="abc", sampling=SamplingParams(max_tokens=5, ignore_eos=True))])
    model.runner.latest_snapshot = runner.latest_snapshot
    metrics.ttft.observe(0.2)
    metrics.ttft.observe(0.4)
    monitor.sample()
    (point,) = monitor.state()["history"]
    assert point["tokens_per_s"] > 0 and point["ttft_s"] == pytest.approx(0.3) and point["requests"] == 2
    monitor.sample()
    assert monitor.state()["history"][-1]["ttft_s"] is None  # no first token in that interval


def test_a_preempted_request_is_shown_parked_in_the_queue():
    from multiseq import Priority
    from test_priorities_unit import make_engine, submit

    engine = make_engine(FakeBackend(num_slots=1, window=512, n_batch=256))
    submit(engine, "batch", "a long batch job")
    for _ in range(6):
        engine.step()
    submit(engine, "chat", "hello", priority=Priority.INTERACTIVE)
    engine.step()
    model = _fake_model(engine.snapshot(time.perf_counter()))
    (queued,) = Monitor(_Models([model]), ServerMetrics(lambda: None), api_key_required=False).state()["models"][0]["queue"]
    assert queued["request_id"] == "batch" and queued["phase"] == "parked" and queued["generated_tokens"] > 0
