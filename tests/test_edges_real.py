"""batch-run at the edges, on the real model: bad bytes, a full disk, a closed pipe, Ctrl-C on a
200,000-line file, kill -9 and --resume, corrupt GGUFs, chat templates for models without one."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers import count_lines, wait_for_lines
from multiseq import models

pytestmark = pytest.mark.model

FAST = ["-np", "4", "-n", "4", "--temperature", "0", "--slot-ctx", "256", "--ignore-eos", "--no-dashboard"]


def write_jsonl(path: Path, count: int) -> Path:
    path.write_text("".join(f'{{"id": "r{index}", "prompt": "Count: {index}"}}\n' for index in range(count)))
    return path


def assert_clean_failure(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert len([line for line in stderr.splitlines() if line.startswith("Error:")]) == 1, stderr


def test_a_line_that_is_not_utf8_is_that_lines_error_and_the_rest_runs(tmp_path, run_cli, read_jsonl):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"id": "a", "prompt": "Hello"}\n{"id": "caf\xe9", "prompt": "x"}\n{"id": "b", "prompt": "Hi"}\n')
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), *FAST)
    assert result.exit_code == 1
    records = {record["id"]: record for record in read_jsonl(out)}
    assert records["a"]["finish_reason"] == records["b"]["finish_reason"] == "length"
    assert records["2"]["error"] == ("line 2: not valid UTF-8: byte 0xe9 at byte 12 of the line (file offset 42): "
                                     "invalid continuation byte")


def with_a_bad_first_line(path: Path) -> Path:
    """The file with a first line that cannot run: its error is the run's first write, at once."""
    path.write_text('{"id": "bad", "prompt": 5}\n' + path.read_text())
    return path


def test_a_full_disk_stops_the_run_with_one_line_and_exit_code_3(tmp_path, start_cli):
    prompts = with_a_bad_first_line(write_jsonl(tmp_path / "prompts.jsonl", 50))
    process = start_cli("batch-run", str(prompts), "-o", "/dev/full", *FAST)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 3
    assert_clean_failure(stderr)
    assert "Error: cannot write results to /dev/full: No space left on device; the run stopped" in stderr
    assert "multiseq run" not in stderr, "it stopped at the first write, not after the batch"


def test_a_closed_pipe_stops_the_run_with_one_line(tmp_path, start_cli):
    prompts = with_a_bad_first_line(write_jsonl(tmp_path / "prompts.jsonl", 50))
    process = start_cli("batch-run", str(prompts), *FAST)
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=120)
    assert process.returncode == 3
    assert_clean_failure(stderr)
    assert "Error: cannot write results to standard output: Broken pipe" in stderr


def test_ctrl_c_on_a_200000_line_file_stops_at_once_and_resume_carries_on(tmp_path, start_cli, read_jsonl):
    total = 200_000
    prompts = write_jsonl(tmp_path / "prompts.jsonl", total)
    out = tmp_path / "out.jsonl"
    args = ["batch-run", str(prompts), "-o", str(out), "-np", "16", "-n", "2", "--temperature", "0", "--ignore-eos",
            "--slot-ctx", "64", "--no-dashboard"]
    process = start_cli(*args)
    wait_for_lines(out, 16, process)
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 5, "the first Ctrl-C ends the run within seconds"
    assert process.returncode == 130, stderr
    first = read_jsonl(out)
    ids = [record["id"] for record in first]
    assert len(ids) == len(set(ids))
    assert {record["finish_reason"] for record in first} <= {"length", "cancelled"}
    assert not any(record["error"] for record in first), "requests that never started get no line"
    assert f"{total - len(first)} not started (--resume runs them)" in stderr

    done_before = {record["id"] for record in first if record["finish_reason"] == "length"}
    process = start_cli(*args, "--resume")
    wait_for_lines(out, len(first) + 16, process)  # past the old lines: the resumed run is writing
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    second = read_jsonl(out)
    ids = [record["id"] for record in second]
    assert len(ids) == len(set(ids)), "no id twice"
    assert done_before <= set(ids) and len(ids) >= len(done_before) + 16


def test_kill_9_at_any_moment_then_resume_gives_every_id_once(tmp_path, start_cli, run_cli, read_jsonl):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", 40)
    out = tmp_path / "out.jsonl"
    process = start_cli("batch-run", str(prompts), "-o", str(out), *FAST)
    wait_for_lines(out, 6, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert 6 <= count_lines(out) < 40
    result = run_cli("batch-run", str(prompts), "-o", str(out), "--resume", *FAST)
    assert result.exit_code == 0, result.output
    final = read_jsonl(out)
    assert sorted(record["id"] for record in final) == sorted(f"r{index}" for index in range(40))
    assert all(record["finish_reason"] == "length" for record in final)


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory):
    """A truncated copy of the real SmolLM2 GGUF (its first MB), and random bytes after a valid magic."""
    folder = tmp_path_factory.mktemp("broken")
    source = models.resolve("smollm2-135m").path
    truncated = folder / "truncated.gguf"
    with source.open("rb") as handle:
        truncated.write_bytes(handle.read(1 << 20))
    scrambled = folder / "scrambled.gguf"
    scrambled.write_bytes(b"GGUF" + os.urandom(1 << 16))
    return {"truncated": truncated, "scrambled": scrambled}


@pytest.mark.parametrize("kind, cause", [("truncated", "gguf_init_from_reader: failed to read"),
                                         ("scrambled", "gguf_init_from_reader: ")])
def test_a_corrupt_gguf_is_one_error_line_and_llama_cpp_says_more_with_v(tmp_path, start_cli, broken_models,
                                                                           kind, cause):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", 2)
    path = broken_models[kind]
    process = start_cli("batch-run", str(prompts), "-m", str(path), "--no-dashboard")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    [line] = stderr.strip().splitlines()
    assert line.startswith(f"Error: llama.cpp could not load the model file {path}: {cause}")
    process = start_cli("batch-run", str(prompts), "-m", str(path), "--no-dashboard", "-v")
    _, verbose = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "llama_model_load: error loading model" in verbose and verbose.strip().splitlines()[-1] == line


def test_a_jinja_chat_template_file_renders_the_messages(tmp_path, run_cli, read_jsonl, smollm):
    template = tmp_path / "qa.jinja"
    template.write_text("{{ bos_token }}{% for message in messages %}Q: {{ message['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}A:{% endif %}")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "q", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}) + "\n")
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "--chat-template", str(template), *FAST)
    assert result.exit_code == 0, result.output
    [record] = read_jsonl(out)
    expected = smollm.tokenize("<|im_start|>Q: What is 2 + 2?\nA:")  # SmolLM2 adds no BOS of its own
    assert record["prompt_tokens"] == len(expected)


def test_a_local_gguf_without_a_template_runs_chats_with_chat_template(tmp_path, run_cli, read_jsonl):
    gemma = models.resolve("gemma3-270m").path  # a path, not the registry name: no fallback template
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "c", "messages": [{"role": "user", "content": "Say hi."}]}) + "\n")
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "-m", str(gemma), *FAST)
    assert result.exit_code == 1
    [record] = read_jsonl(out)
    assert "no chat template" in record["error"] and "--chat-template" in record["error"]
    result = run_cli("batch-run", str(prompts), "-o", str(out), "-m", str(gemma), "--chat-template", "gemma", *FAST)
    assert result.exit_code == 0, result.output
    [record] = read_jsonl(out)
    assert record["error"] is None and record["prompt_tokens"] > 5
