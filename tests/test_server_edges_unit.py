"""The server under strain, on the fake backend: slow request preparation in a pool of its own
(with a time limit), clients that stop reading, streams that wait long for a slot."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from fakes import FakeBackend
from helpers import wait_until
from multiseq import FinishReason
from multiseq.server import ServerSettings, create_app
from multiseq.server import chat as chat_module
from multiseq.server import jobs as jobs_module

MODEL = "fake-model"
USER_HI = [{"role": "user", "content": "Hi"}]
HTTP_TIMEOUT = 10  # seconds: far longer than any answer here should take


def request(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=HTTP_TIMEOUT)
    connection.request(method, path, body=None if body is None else json.dumps(body),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = json.loads(response.read())
    connection.close()
    return response.status, data


def record_results(runner) -> list:
    """The results the runner hands out from now on (every request the server submits)."""
    finished = []
    submit = runner.submit

    def recording_submit(request, **kwargs):
        on_finish = kwargs.get("on_finish")

        def both(result):
            if on_finish is not None:
                on_finish(result)
            finished.append(result)
        return submit(request, **{**kwargs, "on_finish": both})

    runner.submit = recording_submit
    return finished


# --- preparation in a pool of its own -------------------------------------------------------------

@pytest.fixture
def stuck_preparation(monkeypatch):
    """Every request's preparation blocks until the test sets the returned gate; `entered` is
    set once one has started."""
    gate, entered = threading.Event(), threading.Event()
    prepare = chat_module.openai_body_item

    def slow_prepare(*args):
        entered.set()
        gate.wait(HTTP_TIMEOUT * 3)
        return prepare(*args)

    monkeypatch.setattr(chat_module, "openai_body_item", slow_prepare)
    yield gate, entered
    gate.set()


def test_a_stuck_preparation_times_out_clearly_and_files_and_health_still_answer(
        make_runner, serve_app, stuck_preparation, tmp_path):
    gate, entered = stuck_preparation
    runner = make_runner(FakeBackend(num_slots=2, window=256))
    app = create_app(runner, ServerSettings(model_name=MODEL, data_dir=tmp_path, prepare_threads=1,
                                            prepare_timeout_s=0.5))
    base = serve_app(app)
    first: list = []
    stuck = threading.Thread(target=lambda: first.append(request(base, "POST", "/v1/chat/completions",
                                                                 {"model": MODEL, "messages": USER_HI})))
    stuck.start()
    assert entered.wait(HTTP_TIMEOUT), "the first request's preparation started"
    # The only prepare thread is stuck: files, the database and /health go on regardless.
    assert request(base, "GET", "/v1/files") == (200, {"object": "list", "data": [], "first_id": None,
                                                      "last_id": None, "has_more": False})
    assert request(base, "GET", "/health") == (200, {"status": "ok"})
    stuck.join(HTTP_TIMEOUT)
    status, body = first[0]
    assert status == 400 and body["error"]["code"] == "prepare_timeout" and "0.5 s" in body["error"]["message"]
    # The thread is still stuck: the next request never starts preparing, and is told the server is busy.
    status, body = request(base, "POST", "/v1/chat/completions", {"model": MODEL, "messages": USER_HI})
    assert status == 503 and body["error"]["code"] == "prepare_queue_timeout"
    assert "Traceback" not in json.dumps(body)
    gate.set()
    status, body = request(base, "POST", "/v1/chat/completions", {"model": MODEL, "messages": USER_HI,
                                                                  "max_tokens": 3})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", "the pool serves again once free"


def test_the_pools_threads_are_bounded_and_named(make_runner, serve_app):
    runner = make_runner(FakeBackend(num_slots=2, window=256))
    app = create_app(runner, ServerSettings(model_name=MODEL, prepare_threads=2))
    base = serve_app(app)
    for _ in range(6):
        assert request(base, "POST", "/v1/completions", {"prompt": "abc", "max_tokens": 2})[0] == 200
    pool = app.state.server.offload.prepare_executor
    assert 1 <= pool.num_threads <= 2
    assert any(thread.name.startswith("multiseq-prepare-") for thread in threading.enumerate())


# --- clients that stop reading --------------------------------------------------------------------

def stalled_stream(base: str, body: dict) -> socket.socket:
    """A streaming request from a client that never reads its answer (and keeps the connection)."""
    host, port = base.removeprefix("http://").split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    client.connect((host, int(port)))
    payload = json.dumps({**body, "stream": True}).encode()
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: "
                   b"application/json\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return client


@pytest.mark.parametrize("send_timeout_s, max_queued_events", [
    (0.5, 10**9),  # the send blocks for longer than the send timeout
    (60.0, 50),  # the pieces back up in the request's queue first
], ids=["send-timeout", "queue-bound"])
def test_a_client_that_stops_reading_is_cut_and_its_slot_freed(make_runner, serve_app, monkeypatch,
                                                               send_timeout_s, max_queued_events):
    monkeypatch.setattr(jobs_module, "MAX_QUEUED_EVENTS", max_queued_events)
    max_tokens = 8000
    runner = make_runner(FakeBackend(num_slots=1, window=max_tokens + 64, n_batch=64))
    app = create_app(runner, ServerSettings(model_name=MODEL, send_timeout_s=send_timeout_s))
    base = serve_app(app)
    finished = record_results(runner)
    # Each chunk carries 20 alternatives: a few hundred chunks fill every buffer on the way.
    client = stalled_stream(base, {"model": MODEL, "messages": USER_HI, "max_tokens": max_tokens,
                                   "logprobs": True, "top_logprobs": 20, "temperature": 0})
    try:
        wait_until(lambda: finished, timeout=30, what="the stalled request's end")
        assert finished[0].finish_reason is FinishReason.CANCELLED
        assert finished[0].completion_tokens < max_tokens
        wait_until(lambda: runner.engine.scheduler.slots[0].is_free, what="the slot freed")
    finally:
        client.close()
    status, body = request(base, "POST", "/v1/completions", {"prompt": "abc", "max_tokens": 2})
    assert status == 200, "the slot serves the next request"


def open_stream(base: str, body: dict) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=HTTP_TIMEOUT)
    connection.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                       headers={"Content-Type": "application/json"})
    return connection.getresponse()


def test_a_stream_waiting_for_a_slot_gets_keep_alive_comments(make_runner, serve_app):
    runner = make_runner(FakeBackend(num_slots=1, window=512, decode_delay=0.005))
    app = create_app(runner, ServerSettings(model_name=MODEL, keep_alive_s=0.1))
    base = serve_app(app)
    busy = open_stream(base, {"prompt": "first", "max_tokens": 400, "temperature": 0})
    assert busy.readline().startswith(b"data: ")
    waiting = open_stream(base, {"prompt": "second", "max_tokens": 2})
    assert waiting.status == 200
    started = time.monotonic()
    assert waiting.readline() == b": keep-alive\n" and waiting.readline() == b"\n"
    assert waiting.readline() == b": keep-alive\n", "again while it still waits"
    assert time.monotonic() - started < HTTP_TIMEOUT
    assert runner.num_waiting == 1, "the request was still waiting for the slot"
    busy.close()  # the slot frees; the waiting stream then runs to its end
    lines = [line for line in waiting.read().splitlines() if line.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]" and json.loads(lines[-2].removeprefix(b"data: "))["choices"]


def test_the_listening_socket_gives_connections_without_nagles_delay():
    """A kept-alive connection's next response (a stream's next event) goes out at once: with
    Nagle's algorithm on, a body written after its headers waited for the client's delayed ACK,
    40 ms a request (asyncio turns it off only for sockets made with protocol IPPROTO_TCP)."""
    import socket

    from multiseq.server.serve import open_socket

    listener = open_socket("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()[:2]) as client:
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert accepted.proto == socket.IPPROTO_TCP
