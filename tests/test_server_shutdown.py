"""Stopping the server with a real signal, in a process of its own (tests/fake_serve.py: serve()
over the fake backend): open streams end with a last event and [DONE], a request that comes
while it drains gets a 503, and a model still loading never holds the exit. An engine that
stopped after a failure stops the server too, with a non-zero exit, for a supervisor to see."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import read_until

FAKE_SERVE = Path(__file__).with_name("fake_serve.py")
SHUTDOWN_LIMIT = 5  # seconds from the signal to the last stream's end, and to the process's exit
HTTP_TIMEOUT = 10


@pytest.fixture
def start_fake_server():
    """start(*args) -> (process, port): tests/fake_serve.py, once it listens."""
    processes = []

    def start(*args: str) -> tuple[subprocess.Popen, int]:
        process = subprocess.Popen([sys.executable, str(FAKE_SERVE), *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        processes.append(process)
        port = int(read_until(process, "listening on")[-1].split()[-1])
        return process, port

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def open_stream(port: int, max_tokens: int) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    connection.request("POST", "/v1/completions", body=json.dumps({"prompt": "abc", "max_tokens": max_tokens,
                                                                   "stream": True}),
                       headers={"Content-Type": "application/json"})
    return connection.getresponse()


def data_lines(response: http.client.HTTPResponse) -> list[bytes]:
    return [line for line in response.read().splitlines() if line.startswith(b"data: ")]


def test_sigterm_ends_open_streams_refuses_new_requests_and_exits_0(start_fake_server):
    process, port = start_fake_server()
    read_until(process, "ready")
    streams = [open_stream(port, max_tokens=3000) for _ in range(2)]  # 15 s each at the fake's pace
    assert all(stream.status == 200 and stream.readline().startswith(b"data: ") for stream in streams)
    # A request whose body is not all sent yet: it is read on after the signal.
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()
    late = socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT)
    late.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10])
    health = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    health.request("GET", "/health")  # by its answer, the server has read the late request's head
    assert health.getresponse().status == 200

    signalled_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    for stream in streams:
        events = data_lines(stream)
        assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "shutting_down"
        assert events[-1] == b"data: [DONE]"
    assert time.monotonic() - signalled_at < SHUTDOWN_LIMIT

    late.sendall(body[10:])
    response = http.client.HTTPResponse(late)
    response.begin()
    answer = json.loads(response.read())
    late.close()
    assert response.status == 503 and answer["error"]["code"] == "shutting_down"

    _, stderr = process.communicate(timeout=SHUTDOWN_LIMIT)
    assert process.returncode == 0 and "stopped" in stderr and "Traceback" not in stderr, stderr


def test_sigterm_while_the_model_loads_exits_at_once(start_fake_server):
    process, port = start_fake_server("--load-seconds", "600")
    health = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    health.request("GET", "/health")
    assert health.getresponse().status == 503, "still loading"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=SHUTDOWN_LIMIT)
    assert process.returncode == 0 and "stopped" in stderr and "Traceback" not in stderr, stderr


def test_an_engine_that_stops_ends_the_streams_and_the_server_exits_non_zero(start_fake_server):
    process, port = start_fake_server("--fail-decodes-after", "40")  # both slots decode by then
    read_until(process, "ready")
    streams = [open_stream(port, max_tokens=3000) for _ in range(3)]  # the third fails once a slot is free
    assert all(stream.status == 200 for stream in streams)
    for stream in streams:
        events = data_lines(stream)
        assert json.loads(events[-2].removeprefix(b"data: "))["error"]["type"] == "server_error"
        assert events[-1] == b"data: [DONE]"
    _, stderr = process.communicate(timeout=SHUTDOWN_LIMIT + 5)
    assert process.returncode == 1, stderr
    assert "failed: the engine stopped: llama_decode keeps failing" in stderr, stderr
