"""Where the model runs: -ngl, --main-gpu, --split-mode, --tensor-split and --flash-attn reach
llama.cpp's model and context parameters (read back from the structs the backend passed, and
from what llama.cpp reports about the layers' devices and flash attention), a CPU-only build
accepts them and says once that it has no GPU backend, and the header names the device."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from fakes import FakeBackend
from multiseq import Request, Runner, RunnerConfig, SamplingParams, models
from multiseq.llama import backend as llama_backend
from multiseq.llama import devices as llama_devices
from multiseq.cli import main as cli_main
from multiseq.cli.job import OpenedRunner
from multiseq.llama.log import flash_attention_used
from multiseq.loading import open_model
from multiseq.config import FlashAttention, SplitMode

# llama.h's values, written out so that the backend's own translation is what is checked.
LLAMA_SPLIT_MODE_ROW = 2
LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED = -1, 0, 1


# --- the options, without a model -------------------------------------------------------------

@pytest.fixture
def configs_opened(monkeypatch, make_runner):
    """Run batch-run's command line up to the runner it opens, on a fake backend, and keep the
    RunnerConfig it was opened with."""
    opened = []

    def open_fake(config: RunnerConfig) -> OpenedRunner:
        opened.append(config)
        return OpenedRunner(make_runner(FakeBackend(num_slots=2, window=64, n_batch=64)), "fake")

    monkeypatch.setattr(cli_main, "_open_runner", open_fake)
    return opened


def batch_run(tmp_path, *options: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    return CliRunner().invoke(cli_main.cli, ["batch-run", str(prompts), "-o", str(tmp_path / "out.jsonl"), "-n", "2",
                                             "--no-dashboard", *options])


def test_the_options_reach_the_runner_config(tmp_path, configs_opened):
    result = batch_run(tmp_path, "-ngl", "all", "-mg", "1", "-sm", "row", "-ts", "3,1", "-fa", "off")
    assert result.exit_code == 0, result.output
    [config] = configs_opened
    assert (config.n_gpu_layers, config.main_gpu, config.split_mode, config.tensor_split, config.flash_attn) == \
        (-1, 1, SplitMode.ROW, (3.0, 1.0), FlashAttention.OFF)


def test_without_the_options_llama_cpp_decides(tmp_path, configs_opened):
    assert batch_run(tmp_path).exit_code == 0
    [config] = configs_opened
    assert config.n_gpu_layers is None and config.flash_attn is FlashAttention.AUTO and config.tensor_split is None


@pytest.mark.parametrize("options, named", [
    (["-ngl", "auto"], "--n-gpu-layers"), (["-ngl", "-2"], "--n-gpu-layers"), (["-ts", "3,x"], "--tensor-split"),
    (["-ts", "0,0"], "--tensor-split"), (["-sm", "rows"], "--split-mode"), (["-fa", "yes"], "--flash-attn"),
    (["-mg", "-1"], "--main-gpu"), (["-fa", "on", "--batch-invariant"], "batch_invariant"),
])
def test_bad_values_are_one_usage_line(tmp_path, configs_opened, options, named):
    result = batch_run(tmp_path, *options)
    assert result.exit_code == 2 and not configs_opened
    [error] = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert named in error


def test_serve_takes_the_same_options():
    command = cli_main.cli.commands["serve"]
    names = {name for param in command.params for name in param.opts}
    assert {"-ngl", "--n-gpu-layers", "-mg", "--main-gpu", "-sm", "--split-mode", "-ts", "--tensor-split", "-fa",
            "--flash-attn"} <= names


@pytest.mark.parametrize("field, value", [
    ("n_gpu_layers", -2), ("n_gpu_layers", 1.5), ("main_gpu", -1), ("split_mode", "rows"), ("tensor_split", []),
    ("tensor_split", [0, 0]), ("tensor_split", [1, float("nan")]), ("flash_attn", True),
])
def test_the_config_refuses_bad_placements(field, value):
    with pytest.raises(ValueError, match=field):
        RunnerConfig(**{field: value})


def test_batch_invariance_keeps_flash_attention_off():
    assert RunnerConfig(batch_invariant=True).flash_attn is FlashAttention.AUTO  # auto becomes off in the backend
    assert RunnerConfig(batch_invariant=True, flash_attn="off").flash_attn is FlashAttention.OFF
    with pytest.raises(ValueError, match="flash_attn 'on' does not go with batch_invariant"):
        RunnerConfig(batch_invariant=True, flash_attn="on")


def test_placement_in_words():
    descriptions = {"CPU": "AMD EPYC", "CUDA0": "NVIDIA L4", "CUDA1": "NVIDIA L4"}
    assert llama_backend.describe_placement({"CPU": 31}, descriptions) == "CPU (AMD EPYC)"
    assert llama_backend.describe_placement({"CUDA0": 31}, descriptions) == "CUDA0 (NVIDIA L4) 31/31 layers"
    assert llama_backend.describe_placement({"CPU": 11, "CUDA1": 10, "CUDA0": 10}, descriptions) == \
        "CUDA0 (NVIDIA L4) 10/31 layers, CUDA1 (NVIDIA L4) 10/31 layers, CPU (AMD EPYC) 11/31 layers"
    assert llama_backend.describe_placement({}, descriptions) == "unknown"


def test_flash_attention_as_llama_cpp_reports_it():
    asked_auto = ["llama_context: flash_attn            = auto\n"]
    assert flash_attention_used(asked_auto + ["resolve_fused_ops: Flash Attention enabled\n"]) == "enabled"
    assert flash_attention_used(
        asked_auto + ["resolve_fused_ops: Flash Attention not supported, set to disabled\n"]) == "disabled"
    assert flash_attention_used(["llama_context: flash_attn            = disabled\n"]) == "disabled"


def test_the_no_gpu_notice_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(llama_devices, "_notices_said", set())
    with caplog.at_level(logging.WARNING, logger="multiseq.backend"):
        llama_devices.note_no_gpu(99)
        llama_devices.note_no_gpu(-1)
    [record] = caplog.records
    assert "no GPU backend" in record.getMessage() and "99" in record.getMessage()


# --- on the real model: what llama.cpp was given, and what it did -----------------------------

@pytest.fixture(scope="module")
def placed_model():
    """SmolLM2 loaded with every placement option set (to values a CPU-only build ignores)."""
    model = open_model("smollm2-135m", n_gpu_layers=99, main_gpu=1, split_mode="row",
                                          tensor_split=(3, 1))
    yield model
    model.close()


@pytest.mark.model
def test_the_model_params_llama_cpp_got(placed_model):
    params = placed_model.params
    assert params.n_gpu_layers == 99 and params.main_gpu == 1 and params.split_mode == LLAMA_SPLIT_MODE_ROW
    assert params.tensor_split and list(params.tensor_split[:3]) == [3.0, 1.0, 0.0]  # a NULL pointer is falsy


@pytest.mark.model
def test_every_layer_is_where_llama_cpp_put_it(placed_model):
    """llama.cpp's own report of each layer's device: on a build without a GPU backend, -ngl 99
    leaves every layer (and the output layer) on the CPU."""
    if llama_backend.gpu_offload_supported():
        assert "CPU" not in placed_model.layer_devices, placed_model.layer_devices  # 99 >= every layer
    else:
        assert placed_model.layer_devices == {"CPU": placed_model.num_layers}
        assert placed_model.device.startswith("CPU")
    assert sum(placed_model.layer_devices.values()) == placed_model.num_layers


@pytest.mark.model
@pytest.mark.parametrize("flash_attn, asked, used", [
    ("on", LLAMA_FLASH_ATTN_TYPE_ENABLED, {"enabled"}), ("off", LLAMA_FLASH_ATTN_TYPE_DISABLED, {"disabled"}),
    ("auto", LLAMA_FLASH_ATTN_TYPE_AUTO, {"enabled", "disabled"}),
])
def test_flash_attention_reaches_the_context(placed_model, real_runner, flash_attn, asked, used):
    runner = real_runner(placed_model, parallel=2, slot_ctx=64, flash_attn=flash_attn)
    assert runner.backend.context_params.flash_attn_type == asked
    assert runner.backend.flash_attention in used
    # ignore_eos: both tokens, wherever the model would end.
    [result] = runner.run_batch([Request(prompt="The sea is", sampling=SamplingParams(max_tokens=2, temperature=0,
                                                                                      ignore_eos=True))])
    assert result.ok and result.completion_tokens == 2


@pytest.mark.model
def test_batch_invariant_contexts_run_without_flash_attention(unpacked_model, real_runner):
    runner = real_runner(unpacked_model("smollm2-135m"), parallel=2, slot_ctx=64, batch_invariant=True)
    assert runner.backend.context_params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED
    assert runner.backend.flash_attention == "disabled"


@pytest.mark.model
def test_a_runner_config_reaches_the_model_it_loads(monkeypatch, caplog):
    """RunnerConfig -> the model llama.cpp loads; on a CPU-only build the notice comes once,
    however many models load."""
    monkeypatch.setattr(llama_devices, "_notices_said", set())
    config = RunnerConfig(model="smollm2-135m", parallel=2, slot_ctx=64, threads=2, n_gpu_layers=7, split_mode="row",
                          tensor_split=(1, 2), flash_attn="off")
    with caplog.at_level(logging.WARNING, logger="multiseq.backend"):
        with Runner(config) as first, Runner(config) as second:
            for runner in (first, second):
                params = runner.backend.model.params
                assert params.n_gpu_layers == 7 and params.split_mode == LLAMA_SPLIT_MODE_ROW
                assert params.tensor_split and list(params.tensor_split[:2]) == [1.0, 2.0]  # a NULL pointer is falsy
                assert runner.backend.context_params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED
                assert runner.device == runner.backend.model.device
    notices = [record for record in caplog.records if "no GPU backend" in record.getMessage()]
    assert len(notices) == (0 if llama_backend.gpu_offload_supported() else 1)


@pytest.mark.model
def test_a_cpu_run_with_ngl_99_works_and_says_so_once(start_cli, tmp_path):
    models.resolve("smollm2-135m")
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text('{"id": "a", "prompt": "The sea is"}\n{"id": "b", "prompt": "The sky is"}\n')
    process = start_cli("batch-run", str(prompts), "-o", str(output), "-np", "2", "-t", "2", "-n", "2",
                        "--temperature", "0", "-ngl", "99", "--no-dashboard")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(record["id"] for record in records) == ["a", "b"] and all(record["error"] is None for record in records)
    expected_notices = 0 if llama_backend.gpu_offload_supported() else 1
    assert stderr.count("no GPU backend") == expected_notices, stderr
    header = next(line for line in stderr.splitlines() if line.startswith("multiseq smollm2-135m"))
    assert " on " in header and (llama_backend.gpu_offload_supported() or " on CPU" in header), header


# --- Ray workers and their GPUs ---------------------------------------------------------------

def test_worker_gpus_needs_ray(tmp_path, configs_opened):
    result = batch_run(tmp_path, "--worker-gpus", "1")
    assert result.exit_code == 2 and "Error: --worker-gpus needs --ray" in result.output and not configs_opened


def test_a_ray_run_needing_more_gpus_than_the_cluster_has_is_refused(monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'multiseq[ray]')")
    from multiseq import ray as multiseq_ray

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    multiseq_ray.check_cpus(2, 2)
    with pytest.raises(multiseq_ray.RayError, match="2 workers x 1 GPUs need 2 GPUs, and the Ray cluster has 0"):
        multiseq_ray.check_cpus(2, 2, gpus=1)


def test_the_ray_predictor_takes_the_placement(monkeypatch):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'multiseq[ray]')")
    from multiseq import ray as multiseq_ray

    class NoActor:
        def __init__(self, config):
            self.config = config

        def ready(self):
            return {"error": None, "model_name": "fake"}

    monkeypatch.setattr(multiseq_ray, "_RunnerActor", NoActor)
    predictor = multiseq_ray.MultiseqPredictor(n_gpu_layers=-1, split_mode="none", main_gpu=1, tensor_split=(1, 1),
                                               flash_attn="off", max_tokens=8)
    config = predictor._actor.config
    assert (config.n_gpu_layers, config.split_mode, config.main_gpu, config.tensor_split, config.flash_attn) == \
        (-1, SplitMode.NONE, 1, (1.0, 1.0), FlashAttention.OFF)
    assert predictor._defaults.max_tokens == 8
