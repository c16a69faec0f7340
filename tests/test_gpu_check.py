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
    names = set(made.tensor_names)
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


def load_prepare():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("prepare", str(REPO / "bench" / "gpu" / "prepare"))
    spec = importlib.util.spec_from_loader("prepare", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_kit_check_names_a_library_no_one_gives_and_a_build_without_cuda(tmp_path):
    """prepare refuses to pack a kit that would fail on the device before any phase ran."""
    import importlib.util
    import shutil

    prepare = load_prepare()
    built = Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0]) / "lib"  # (not imported)
    for sub in ("bin", "lib"):
        (tmp_path / sub).mkdir()
    shutil.copy2(next(built.glob("libllama.so*")), tmp_path / "lib" / "libllama.so")  # without its libggml
    problems = prepare.check_kit(tmp_path)
    assert any(problem.startswith("libllama.so needs libggml") for problem in problems), problems
    assert problems[-1] == "the kit has no libggml-cuda: llama.cpp was built without CUDA"
