"""llama.cpp's AMX kernels stop the process with an illegal instruction (this llama.cpp loses
their tile configuration): where the build would load weights for them, a model is loaded
without the CPU's extra layouts, and a warning says so once, after the model loaded."""

import logging

import pytest

from multiseq.llama import backend, devices
from multiseq.llama.devices import system_info_sections
from multiseq.loading import open_model


def test_the_cpu_extra_buffer_types_are_the_ones_the_build_says_it_has():
    names = backend._platform.cpu_extra_buffer_types()
    cpu = system_info_sections(backend.llama_build().system_info).get("CPU", {})
    assert ("CPU_REPACK" in names) == (cpu.get("REPACK") == "1"), (names, cpu)
    assert "AMX" not in names or cpu.get("AMX_INT8") == "1", (names, cpu)


@pytest.fixture
def cpu_layouts(monkeypatch):
    """Set the CPU's extra layouts the model loader sees; the warning not yet given."""
    monkeypatch.setattr(devices, "_notices_said", set())
    return lambda names: monkeypatch.setattr(backend._platform, "cpu_extra_buffer_types", lambda: names)


def use_extra_buffer_types(repack_weights: bool) -> bool:
    model = backend.LlamaModel.__new__(backend.LlamaModel)  # the parameters alone, no file loaded
    return bool(model._model_params(repack_weights, None, 0, "layer", None).use_extra_bufts)


def test_weights_are_repacked_where_the_build_has_no_amx_kernels(cpu_layouts):
    cpu_layouts(["CPU_REPACK"])
    assert use_extra_buffer_types(repack_weights=True)
    assert not use_extra_buffer_types(repack_weights=False)


def test_a_build_with_amx_kernels_loads_weights_without_the_extra_layouts(cpu_layouts):
    cpu_layouts(["AMX", "CPU_REPACK"])
    assert not use_extra_buffer_types(repack_weights=True)


@pytest.mark.model
def test_a_model_loaded_without_its_amx_layouts_says_so_once_and_runs(cpu_layouts, caplog):
    cpu_layouts(["AMX", "CPU_REPACK"])
    with caplog.at_level(logging.WARNING, logger="multiseq.backend"):
        first, second = open_model("smollm2-135m"), open_model("smollm2-135m")
    [warning] = [record.getMessage() for record in caplog.records if record.name == "multiseq.backend"]
    assert "AMX" in warning and "not repacked" in warning
    assert not first.params.use_extra_bufts and not second.params.use_extra_bufts
    caplog.clear()
    open_model("smollm2-135m", repack_weights=False)
    assert not caplog.records, "a model asked without repacking is not a loss worth a warning"
