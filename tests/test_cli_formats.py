"""batch-run as people use it: input formats, OpenAI Batch output, resume, strictness, stats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import wait_for_lines

pytestmark = pytest.mark.model

FAST = ["-np", "4", "-n", "6", "--temperature", "0", "--slot-ctx", "256", "--ignore-eos"]


def write(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_plain_text_lines_are_prompts_with_line_number_ids(tmp_path, run_cli, read_jsonl):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\n\nName a color.\nCount to three.\n")
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), *FAST)
    assert result.exit_code == 0, result.output
    records = read_jsonl(out)
    assert sorted(record["id"] for record in records) == ["1", "3", "4"]
    assert all(record["completion_tokens"] == 6 and record["text"] for record in records)


def test_openai_batch_input_gives_openai_batch_output(tmp_path, run_cli, read_jsonl):
    prompts = write(tmp_path / "batch.jsonl", [
        {"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5}},
        {"custom_id": "text-1", "method": "POST", "url": "/v1/completions",
         "body": {"model": "x", "prompt": "Once upon a time", "max_tokens": 7, "temperature": 0}},
        {"custom_id": "bad-1", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}},
    ])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), *FAST)
    assert result.exit_code == 1, result.output  # the moderations line failed
    records = {record["custom_id"]: record for record in read_jsonl(out)}
    chat, text, bad = records["chat-1"], records["text-1"], records["bad-1"]
    assert chat["id"].startswith("batch_req_") and chat["error"] is None
    assert chat["response"]["status_code"] == 200
    body = chat["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 5
    text_body = text["response"]["body"]
    assert text_body["object"] == "text_completion" and text_body["usage"]["completion_tokens"] == 7
    assert text_body["choices"][0]["text"] and text_body["choices"][0]["finish_reason"] == "length"
    error = bad["response"]["body"]["error"]
    assert bad["response"]["status_code"] == 400 and bad["error"] is None
    assert "line 3" in error["message"] and error["param"] == "url" and error["type"] == "invalid_request_error"

def test_scoring_lines_run_like_any_other(tmp_path, run_cli, read_jsonl):
    """An eval's loglikelihood requests as Batch API lines: echo with logprobs scores every
    prompt token (max_tokens 0: the prompt alone), a list of prompts gives a choice each, and
    echo with n > 1 is that line's 400 while the others run."""
    prompts = write(tmp_path / "batch.jsonl", [
        {"custom_id": "score", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "The capital of France is Paris", "max_tokens": 0, "echo": True, "logprobs": 1}},
        {"custom_id": "pair", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": ["One two", "three four"], "max_tokens": 1, "echo": True, "logprobs": 2,
                  "temperature": 0}},
        {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "x", "max_tokens": 1, "echo": True, "n": 2}},
    ])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "-np", "4", "--slot-ctx", "256")
    assert result.exit_code == 1, result.output  # the bad line failed
    records = {record["custom_id"]: record for record in read_jsonl(out)}
    [scored] = records["score"]["response"]["body"]["choices"]
    assert scored["text"] == "The capital of France is Paris"
    logprobs = scored["logprobs"]
    assert logprobs["token_logprobs"][0] is None and len(logprobs["tokens"]) >= 6
    assert all(value < 0 for value in logprobs["token_logprobs"][1:])
    assert [len(top) for top in logprobs["top_logprobs"][1:]] == [1] * (len(logprobs["tokens"]) - 1)
    pair = records["pair"]["response"]["body"]["choices"]
    assert [choice["text"][:len(prompt)] for choice, prompt in zip(pair, ("One two", "three four"))] == \
        ["One two", "three four"]
    assert all(len(choice["logprobs"]["tokens"]) == 3 for choice in pair)  # two prompt tokens, one generated
    bad = records["bad"]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "n"



def test_format_can_be_forced(tmp_path, run_cli, read_jsonl):
    prompts = write(tmp_path / "prompts.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "--format", "text", "--text-mode", "completion", *FAST)
    assert result.exit_code == 0
    assert sorted(record["id"] for record in read_jsonl(out)) == ["1", "2"]


def test_input_order_keeps_the_file_order(tmp_path, run_cli, read_jsonl):
    prompts = write(tmp_path / "prompts.jsonl",
                    [{"id": f"r{index}", "prompt": "Tell me a story.", "max_tokens": 12 - index} for index in range(8)])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "--order", "input", *FAST[:2], "--ignore-eos")
    assert result.exit_code == 0
    assert [record["id"] for record in read_jsonl(out)] == [f"r{index}" for index in range(8)]


def test_duplicate_ids_stop_the_run_before_anything_runs(tmp_path, run_cli):
    prompts = write(tmp_path / "prompts.jsonl", [{"id": "x", "prompt": "a"}, {"id": "y", "prompt": "b"},
                                                 {"id": "x", "prompt": "c"}])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), *FAST)
    assert result.exit_code == 2
    assert "duplicate ids" in result.stderr and "'x' (lines 1, 3)" in result.stderr
    assert not out.exists()


def test_strict_stops_on_a_bad_line_and_says_which(tmp_path, run_cli):
    prompts = write(tmp_path / "prompts.jsonl", [{"prompt": "fine"}, '{"prompt": ', {"prompt": ""}])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "--strict", *FAST)
    assert result.exit_code == 2
    assert "line 2" in result.stderr and "line 3" in result.stderr and not out.exists()


def test_stats_json_holds_the_summary(tmp_path, run_cli):
    prompts = write(tmp_path / "prompts.jsonl", [{"prompt": "Hello"}, {"prompt": "World"}])
    stats = tmp_path / "stats.json"
    result = run_cli("batch-run", str(prompts), "-o", str(tmp_path / "out.jsonl"), "--stats-json", str(stats), *FAST)
    assert result.exit_code == 0
    summary = json.loads(stats.read_text())
    assert summary["succeeded"] == 2 and summary["generated_tokens"] == 12
    assert summary["ttft_p50_s"] > 0 and summary["tokens_per_s"] > 0 and "decode_tokens_per_s" in summary


def test_ctrl_c_writes_finished_and_partial_results_then_resume_completes_each_id_once(tmp_path, run_cli, read_jsonl, start_cli):
    ids = [f"item-{index}" for index in range(10)]
    prompts = write(tmp_path / "prompts.jsonl",
                    [{"id": item_id, "prompt": f"Story number {index}:", "max_tokens": 6 if index == 0 else 60}
                     for index, item_id in enumerate(ids)])
    out = tmp_path / "out.jsonl"
    process = start_cli("batch-run", str(prompts), "-o", str(out), "-np", "2", "--temperature", "0", "--ignore-eos", "--slot-ctx", "512",
                              "--no-dashboard")
    wait_for_lines(out, 1, process)  # item-0 finished; others are running or queued
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    first = {record["id"]: record for record in read_jsonl(out)}
    assert first["item-0"]["finish_reason"] == "length"
    cancelled = [record for record in first.values() if record["finish_reason"] == "cancelled"]
    assert 1 <= len(cancelled) <= 2, "the requests in the two slots are written as cancelled"
    assert all(record["error"] is None for record in cancelled), "they ran: partial, not failed"
    assert any(record["text"] for record in cancelled), "partial text kept"
    not_started = len(ids) - len(first)
    assert not_started >= 7, "requests that never started get no line"
    assert f"{not_started} not started (--resume runs them)" in stderr

    result = run_cli("batch-run", str(prompts), "-o", str(out), "--resume", "-np", "4", "-n", "5",
                     "--temperature", "0", "--ignore-eos", "--slot-ctx", "512")
    assert result.exit_code == 0, result.output
    final = read_jsonl(out)
    assert sorted(record["id"] for record in final) == sorted(ids), "no id lost, none twice"
    assert all(record["finish_reason"] == "length" and record["error"] is None for record in final)
    assert {record["id"]: record["text"] for record in final}["item-0"] == first["item-0"]["text"]


def fill_pipe(fd: int) -> None:
    """Write to the non-blocking `fd` until its pipe holds no more: a blocking writer to the same
    pipe then waits until somebody reads."""
    for size in (4096, 1):
        try:
            while True:
                os.write(fd, b"." * size)
        except BlockingIOError:
            pass


def test_a_second_ctrl_c_exits_at_once(tmp_path, start_cli):
    """The first Ctrl-C stops the run in order, and here that stop cannot finish: standard error
    is a full pipe, so the summary it prints waits. Ctrl-C is pressed again until the process
    ends, which only a later Ctrl-C that exits at once can do, before the summary is written."""
    prompts = write(tmp_path / "prompts.jsonl",
                    [{"prompt": "Hello", "max_tokens": 2}] + [{"prompt": f"Long story {index}:"} for index in range(3)])
    out, fifo = tmp_path / "out.jsonl", tmp_path / "stderr"
    os.mkfifo(fifo)
    with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb", buffering=0) as reader:
        with open(fifo, "wb", buffering=0) as stderr:  # blocking: the process waits when the pipe is full
            process = start_cli("batch-run", str(prompts), "-o", str(out), "-np", "1", "-n", "2000", "--ignore-eos",
                                "--no-dashboard", stdout=subprocess.DEVNULL, stderr=stderr)
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb", buffering=0) as filler:
            wait_for_lines(out, 1, process)  # the short prompt's result: the run is on, a long prompt generating
            fill_pipe(filler.fileno())
            presses, deadline = 0, time.monotonic() + 60
            while process.poll() is None:
                assert time.monotonic() < deadline, f"still running after {presses} Ctrl-C"
                process.send_signal(signal.SIGINT)
                presses += 1
                try:
                    process.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
        written = reader.read().decode("utf-8", "replace")  # every writer is closed: up to the end
    assert process.returncode == 130 and presses >= 2, (process.returncode, presses)
    assert "multiseq" in written, "the header was written before the pipe filled"
    assert "interrupted:" not in written, "the orderly stop did not get to its end"


def test_dashboard_on_a_real_terminal_shows_slots_and_completes(tmp_path, read_jsonl, start_cli):
    import pty

    prompts = write(tmp_path / "prompts.jsonl", [{"id": f"d{index}", "prompt": f"Fact {index}:"} for index in range(12)])
    out = tmp_path / "out.jsonl"
    controller, terminal = pty.openpty()
    args = ["batch-run", str(prompts), "-o", str(out), "-np", "4", "-n", "48", "--ignore-eos", "--slot-ctx", "256"]
    env = dict(os.environ, COLUMNS="140", LINES="40", TERM="xterm-256color")
    process = start_cli(*args, stdin=terminal, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    screen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is gone
            break
        if not chunk:
            break
        screen += chunk
    process.wait(timeout=120)
    os.close(controller)
    text = screen.decode("utf-8", "replace")
    assert process.returncode == 0, text[-2000:]
    assert "slots" in text and "phase" in text and "decode" in text and "tok/s" in text
    assert "\x1b[" in text, "rich drew the live view with terminal control codes"
    assert len(read_jsonl(out)) == 12
