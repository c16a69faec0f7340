"""llama.cpp's AMX kernels stop the process with an illegal instruction (this llama.cpp loses
their tile configuration): where the build would load weights for them, the model is loaded
without extra buffer types, and a warning says so once."""

import logging

import pytest

from multiseq.llama import backend
from multiseq.llama.devices import system_info_sections


def test_the_cpu_extra_buffer_types_are_the_ones_the_build_says_it_has():
    names = backend._platform.cpu_extra_buffer_types()
    cpu = system_info_sections(backend.llama_build().system_info).get("CPU", {})
    assert ("CPU_REPACK" in names) == (cpu.get("REPACK") == "1"), (names, cpu)
    assert "AMX" not in names or cpu.get("AMX_INT8") == "1", (names, cpu)


@pytest.fixture
def extra_buffer_types(monkeypatch):
    """Set the CPU's extra buffer types the model loader sees; the warning not yet given."""
    monkeypatch.setattr(backend, "_amx_noted", False)
    return lambda names: monkeypatch.setattr(backend._platform, "cpu_extra_buffer_types", lambda: names)


def use_extra_buffer_types(repack_weights: bool) -> bool:
    model = backend.LlamaModel.__new__(backend.LlamaModel)  # the parameters alone, no file loaded
    return bool(model._model_params(repack_weights, None, 0, "layer", None).use_extra_bufts)


def test_weights_are_repacked_where_the_build_has_no_amx_kernels(extra_buffer_types, caplog):
    extra_buffer_types(["CPU_REPACK"])
    assert use_extra_buffer_types(repack_weights=True)
    assert not use_extra_buffer_types(repack_weights=False)
    assert not caplog.records


def test_a_build_with_amx_kernels_loads_weights_without_them_and_says_so_once(extra_buffer_types, caplog):
    extra_buffer_types(["AMX", "CPU_REPACK"])
    with caplog.at_level(logging.WARNING, logger="multiseq.backend"):
        assert not use_extra_buffer_types(repack_weights=True)
        assert not use_extra_buffer_types(repack_weights=True)
    [warning] = [record.getMessage() for record in caplog.records]
    assert "AMX" in warning and "not repacked" in warning
