"""The `multiseq` command through click's CliRunner, on the default real model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from multiseq.cli.main import cli

pytestmark = pytest.mark.model


def test_batch_run_writes_one_result_per_prompt_and_a_summary(tmp_path, run_cli, read_jsonl):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join([
        json.dumps({"id": "a", "prompt": "The capital of France is"}),
        json.dumps({"prompt": "Once upon a time", "max_tokens": 3}),
        json.dumps({"id": "chat", "messages": [{"role": "user", "content": "Say hi."}]}),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    # --ignore-eos: every line has a text and the short one its 3 tokens, wherever the model would end.
    result = run_cli("batch-run", str(prompts), "-o", str(out), "-np", "2", "-n", "8", "--temperature", "0",
                     "--slot-ctx", "256", "--ignore-eos")
    assert result.exit_code == 0, result.output
    records = {record["id"]: record for record in read_jsonl(out)}
    assert set(records) == {"a", "2", "chat"}
    assert records["2"]["completion_tokens"] == 3
    assert all(record["error"] is None and record["text"] for record in records.values())
    assert "throughput" in result.stderr and "decode rate" in result.stderr


def test_batch_run_to_stdout_prints_only_results(tmp_path, run_cli):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    result = run_cli("batch-run", str(prompts), "-n", "2", "--ignore-eos")
    assert result.exit_code == 0
    [line] = result.stdout.splitlines()
    assert json.loads(line)["completion_tokens"] == 2


def test_a_bad_line_is_an_error_result_and_the_rest_runs(tmp_path, run_cli, read_jsonl):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": 5}\nnot json\n{"prompt": "x", "max_tokens": "many"}\n')
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "-n", "2")
    assert result.exit_code == 1
    records = {record["id"]: record for record in read_jsonl(out)}
    assert records["1"]["error"] is None
    assert "line 2" in records["2"]["error"] and "prompt" in records["2"]["error"]
    assert "line 3" in records["3"]["error"] and "JSON" in records["3"]["error"]
    assert "max_tokens" in records["4"]["error"]


def test_unknown_model_is_one_clear_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    result = CliRunner().invoke(cli, ["batch-run", str(prompts), "-m", "no-such-model"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: unknown model 'no-such-model': known models are gemma3-270m, smollm2-135m, or give a path to a .gguf file, "
        "or a Hugging Face model as hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf"]


def test_models_path_prints_the_file(tmp_path, run_cli):
    result = run_cli("models", "path", "smollm2-135m")
    assert result.exit_code == 0 and result.stdout.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_file_that_is_not_gguf_is_one_clear_line(tmp_path):
    fake = tmp_path / "broken.gguf"
    fake.write_bytes(b"not a model at all")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    result = CliRunner().invoke(cli, ["batch-run", str(prompts), "-m", str(fake)])
    assert result.exit_code == 1
    assert "not a GGUF file" in result.stderr and "Traceback" not in result.output
