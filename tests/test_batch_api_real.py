"""The Batch API of `multiseq serve` as a user runs it, on SmolLM2: the server killed with
SIGKILL in the middle of a batch, then started again on the same data directory, finishes it
with every custom_id exactly once and the lines written before the kill kept as they were."""

from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path

import openai
import pytest

from helpers import read_until, wait_until

pytestmark = pytest.mark.model

LISTENING = re.compile(r"OpenAI API at (http://127\.0\.0\.1:\d+)/v1")
NUM_LINES = 12


def start_server(start_cli, data_dir: Path) -> tuple[object, openai.OpenAI]:
    """`multiseq serve` on a free port, ready; its stderr drained from then on (the access log
    of the polling would otherwise fill the pipe and stall it)."""
    process = start_cli("serve", "-m", "smollm2-135m", "-np", "2", "-c", "1024", "--port", "0", "--no-dashboard",
                        "-t", "1", "--data-dir", str(data_dir))
    lines = read_until(process, "ready:")
    base = next(match.group(1) for line in lines if (match := LISTENING.search(line)))
    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
    return process, openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_a_batch_killed_mid_run_resumes_and_writes_each_custom_id_once(start_cli, tmp_path):
    data_dir = tmp_path / "data"
    source = tmp_path / "input.jsonl"
    source.write_text("".join(json.dumps({
        "custom_id": f"story-{index}", "method": "POST", "url": "/v1/completions",
        "body": {"model": "smollm2-135m", "prompt": f"Once upon a time, number {index}", "max_tokens": 16,
                 "temperature": 0, "ignore_eos": True}}) + "\n" for index in range(NUM_LINES)))
    process, client = start_server(start_cli, data_dir)
    batch = client.batches.create(input_file_id=client.files.create(file=source.open("rb"), purpose="batch").id,
                                  endpoint="/v1/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2, 120, "two lines done")
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    written = (data_dir / "batches" / batch.id / "output.jsonl").read_bytes()
    whole_lines = written[:written.rfind(b"\n") + 1].decode().splitlines()
    assert 2 <= len(whole_lines) < NUM_LINES, "killed in the middle of the batch"

    process, client = start_server(start_cli, data_dir)
    wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 120, "the batch completed")
    batch = client.batches.retrieve(batch.id)
    output = client.files.content(batch.output_file_id).text.splitlines()
    ids = sorted(json.loads(line)["custom_id"] for line in output)
    assert ids == sorted(f"story-{index}" for index in range(NUM_LINES)) and batch.error_file_id is None
    assert output[:len(whole_lines)] == whole_lines, "the lines done before the kill are kept, not run again"
    assert batch.request_counts.completed == NUM_LINES and batch.request_counts.total == NUM_LINES
    for line in output:
        choice = json.loads(line)["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "length" and choice["text"]
    process.send_signal(signal.SIGTERM)
    process.wait(30)
    assert process.returncode == 0


def test_a_data_directory_that_cannot_be_used_is_one_line_and_exit_1(start_cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    process = start_cli("serve", "--port", "0", "--no-dashboard", "--data-dir", str(blocker / "data"))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stderr
    assert "cannot use the data directory" in stderr and "Traceback" not in stderr
