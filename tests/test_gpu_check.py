"""The GPU check (bench/gpu/run) as a dry run on the CPU: the same command and measurements with
tiny models, so that the scripts that run in a rare, short GPU window cannot rot between two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
sys.path.insert(0, str(REPO / "tests"))

from make_model import SHAPES, make_model  # noqa: E402
from tiny_models import read_header  # noqa: E402

pytestmark = pytest.mark.model


def test_a_made_model_has_its_shape_and_the_vocabulary_it_was_given(tmp_path):
    from tiny_models import deepseek_qwen_header

    header = deepseek_qwen_header()
    path = make_model("tiny-qwen2", tmp_path / "m.gguf", header, template="{{ messages }}")
    made = read_header(path)
    shape = SHAPES["tiny-qwen2"]
    assert made.value("general.architecture") == "qwen2"
    assert made.value("qwen2.block_count") == shape.layers
    assert made.value("tokenizer.chat_template") == "{{ messages }}"
    assert made.array_length("tokenizer.ggml.tokens") == read_header(header).array_length("tokenizer.ggml.tokens")
    names = {tensor.name for tensor in made.tensors}
    assert "blk.1.attn_q.bias" in names and "output.weight" in names  # qwen2: biases, an output of its own


def test_the_dry_run_measures_every_phase_and_writes_both_reports(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key != "MULTISEQ_LLAMA_BIN"}
    environment.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    finished = subprocess.run([str(REPO / "bench" / "gpu" / "run"), "--dry-run", "--no-peers",
                               "--models", str(tmp_path / "models")],
                              env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["mode"] == "dry run"
    assert list(report["phases"]) == ["batch", "hostpath", "serve", "spec", "reader", "batch-8b"]
    for name, result in report["phases"].items():
        assert "error" not in result and "skipped" not in result, (name, result)
    batch = report["phases"]["batch"]["rows"]
    assert [row["parallel"] for row in batch] == [1, 4] and all(row["multiseq"]["tokens_per_s"] > 0 for row in batch)
    hostpath = report["phases"]["hostpath"]["rows"]
    assert {(row["sampling"], row["sampled"]) for row in hostpath} == {
        ("host", False), ("host", True), ("backend", False), ("backend", True)}
    assert all(0 < row["device_ms"] < row["step_ms"] for row in hostpath)
    assert [figure["system"] for figure in report["phases"]["serve"]["figures"]] == ["multiseq"]
    assert set(report["phases"]["spec"]["slots"]) == {"1", "2"}
    assert report["phases"]["reader"]["ratio"] > 0
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| np | prompts x tokens |" in table and "host share" in table and "with the reader" in table
