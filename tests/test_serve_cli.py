"""`multiseq serve` as a user runs it: in its own process, on a free port, stopped by a signal;
and the mistakes a user makes, each one line and no traceback."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import time

import openai
import pytest

from helpers import read_until

pytestmark = pytest.mark.model

LISTENING = re.compile(r"OpenAI API at (http://127\.0\.0\.1:\d+)/v1")


def test_serve_answers_the_openai_client_and_stops_on_sigterm(start_cli):
    process = start_cli("serve", "-m", "smollm2-135m", "-np", "2", "-c", "1024", "--port", "0", "--no-dashboard",
                        "--alias", "local", "-t", "1", "--allowed-hosts", "my.lan", "--strict-fields")
    lines = read_until(process, "ready:")
    base = next(match.group(1) for line in lines if (match := LISTENING.search(line)))
    assert "a KV pool of 1,024 tokens (f16" in "".join(lines) and "for 2 slots, a session up to 1,024 tokens" in \
        "".join(lines), "-c is one pool the slots share"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    # min_tokens: a sampled reply with a text, whatever this run draws.
    reply = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                           extra_body={"min_tokens": 1})
    assert reply.choices[0].message.content and reply.model == "local"
    assert [status_of(base, host) for host in ("my.lan:8080", "evil.example")] == [200, 421], "--allowed-hosts"
    with pytest.raises(openai.BadRequestError, match="unknown field 'mirostat'"):  # --strict-fields
        client.chat.completions.create(model="local", messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                       extra_body={"mirostat": 2})
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=15)
    assert process.returncode == 0, rest
    assert "multiseq serve stopped" in rest and "Traceback" not in "".join(lines) + rest


def status_of(base: str, host: str) -> int:
    """The status of GET /v1/models sent with this Host header."""
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request("GET", "/v1/models", headers={"Host": host})
    status = connection.getresponse().status
    connection.close()
    return status


def test_serve_serves_two_models_each_picked_by_name(start_cli):
    process = start_cli("serve", "-m", "smollm2-135m", "-m", "gemma3-270m", "-np", "1", "-c", "512", "--port", "0",
                        "--no-dashboard", "-t", "1")
    lines = read_until(process, "ready:")
    base = next(match.group(1) for line in lines if (match := LISTENING.search(line)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    deadline = time.monotonic() + 60
    while [model.model_extra["status"]["value"] for model in client.models.list()] != ["loaded", "loaded"]:
        assert time.monotonic() < deadline, "the second model did not load"
        time.sleep(0.2)
    for model in ("smollm2-135m", "gemma3-270m"):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=2, extra_body={"min_tokens": 1})
        assert reply.model == model and reply.usage.completion_tokens == 2
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=15)
    assert process.returncode == 0 and "Traceback" not in "".join(lines) + rest


def test_serve_serves_the_models_a_folder_holds(start_cli, tmp_path):
    from multiseq import models

    (tmp_path / "gemma").mkdir()
    (tmp_path / "small.gguf").symlink_to(models.resolve("smollm2-135m").path)
    (tmp_path / "gemma" / "model.gguf").symlink_to(models.resolve("gemma3-270m").path)
    process = start_cli("serve", "--models-dir", str(tmp_path), "--models-max", "2", "-np", "1", "-c", "512",
                        "--port", "0", "--no-dashboard", "-t", "1")
    lines = read_until(process, "ready:")
    base = next(match.group(1) for line in lines if (match := LISTENING.search(line)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    assert [model.id for model in client.models.list()] == ["gemma", "small.gguf"]
    reply = client.chat.completions.create(model="small.gguf", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=2, extra_body={"min_tokens": 1})
    assert reply.model == "small.gguf" and reply.usage.completion_tokens == 2
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=15)
    assert process.returncode == 0 and "Traceback" not in "".join(lines) + rest


def test_serve_with_windows_says_so_and_divides_c_among_the_slots(start_cli):
    process = start_cli("serve", "-m", "smollm2-135m", "-np", "2", "-c", "1024", "--no-kv-unified", "--port", "0",
                        "--no-dashboard", "-t", "1")
    lines = read_until(process, "ready:")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=15)
    assert "2 slots x 512 tokens of f16 KV" in "".join(lines)


@pytest.mark.parametrize("flags, says", [
    ([], "held in a window of 512 per slot while every session fits one"),
    (["--kv-unified"], "held in one pool (--kv-unified"),
])
def test_the_ready_line_says_how_the_pool_is_held(start_cli, flags, says):
    process = start_cli("serve", "-m", "smollm2-135m", "-np", "2", "-c", "1024", *flags, "--port", "0",
                        "--no-dashboard", "-t", "1")
    lines = read_until(process, "ready:")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=15)
    assert "a KV pool of 1,024 tokens" in lines[-1] and says in lines[-1]


def test_every_interface_without_allowed_hosts_is_warned_about(start_cli):
    with socket.socket() as taken:  # taken, so the server stops before it loads anything
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_cli("serve", "-np", "1", "--host", "0.0.0.0", "--port", str(port), "--no-dashboard")
        _, stderr = process.communicate(timeout=60)
    assert "without --allowed-hosts" in stderr and "DNS rebinding" in stderr
    assert process.returncode == 1 and "Traceback" not in stderr


def test_a_taken_port_is_one_line_and_exit_1(start_cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_cli("serve", "-np", "1", "--port", str(port), "--no-dashboard")
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("args, words, code", [
    (["-m", "no-such-model"], "unknown model 'no-such-model'", 1),
    (["-c", "1024", "--slot-ctx", "512", "--no-kv-unified"], "not both", 2),
    (["-c", "1024", "--slot-ctx", "2048"], "caps a session above the whole pool", 2),
    (["-np", "8", "-c", "64", "--no-kv-unified"], "leaves 8 tokens", 2),
    (["--chat-template", "no-such-template"], "unknown chat template", 2),
    (["-m", "smollm2-135m", "-m", "smollm2-135m"], "two models would be served as 'smollm2-135m'", 2),
    (["-m", "smollm2-135m", "-m", "gemma3-270m", "--ray", "--models-max", "2"], "with --ray every model loads", 2),
    (["-m", "smollm2-135m", "-m", "no-such-model"], "unknown model 'no-such-model'", 1),
    (["-m", "smollm2-135m", "-m", "gemma3-270m", "--models-max", "1"], "--models-max 1 leaves no room", 2),
    (["-m", "smollm2-135m", "-m", "gemma3-270m", "--models-keep-alive", "soon"], "--models-keep-alive must be", 2),
])
def test_bad_options_are_one_line_and_nothing_starts(start_cli, args, words, code):
    process = start_cli("serve", "--port", "0", "--no-dashboard", *args)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code and words in stderr and "Traceback" not in stderr


def test_sigterm_ends_an_open_stream_with_done_and_exits_0(start_cli):
    process = start_cli("serve", "-m", "smollm2-135m", "-np", "1", "-c", "1024", "--port", "0", "--no-dashboard",
                        "-t", "1", "--ignore-eos")
    lines = read_until(process, "ready:")
    base = next(match.group(1) for line in lines if (match := LISTENING.search(line)))
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once upon a time", "max_tokens": 900,
                                                                   "stream": True}),
                       headers={"Content-Type": "application/json"})
    stream = connection.getresponse()
    assert stream.readline().startswith(b"data: ")
    signalled_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    events = [line for line in stream.read().splitlines() if line.startswith(b"data: ")]
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "shutting_down"
    assert events[-1] == b"data: [DONE]" and time.monotonic() - signalled_at < 5
    _, rest = process.communicate(timeout=15)
    assert process.returncode == 0 and "Traceback" not in rest, rest
