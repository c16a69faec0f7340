"""The devices llama.cpp's build sees, and what it was built with, as plain values.

Imports nothing of llama_cpp: ggml's device registry (ggml-backend.h), which llama-cpp-python
loads but does not bind, is bound here with ctypes on the library multiseq.llama.backend finds and
hands over (`GgmlRegistry`).
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

_DEVICE_KINDS = ("CPU", "GPU", "integrated GPU", "accelerator", "meta")  # ggml_backend_dev_type's order


@dataclass(frozen=True)
class Device:
    """A device ggml sees: its name (CPU, CUDA0, Metal, Vulkan0, ...), description, kind, memory."""

    name: str
    description: str
    kind: str  # "CPU", "GPU", "integrated GPU", "accelerator" or "meta"
    memory_free_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class LlamaBuild:
    """What the llama.cpp under multiseq was built with, and what it sees on this machine."""

    llama_cpp_python: str  # the version of llama-cpp-python, which pins llama.cpp's sources
    gpu_offload: bool  # whether a GPU backend is present
    max_devices: int
    supports_mmap: bool
    supports_mlock: bool
    backends: list[str]
    devices: list[Device]
    cpu_features: list[str]  # the CPU features the build uses (AVX2, NEON, ...), from system_info
    cpu_weight_layouts: list[str]  # the CPU's extra buffer types (AMX, CPU_REPACK, ...): see cpu_extra_buffer_types
    system_info: str  # llama_print_system_info(), as llama.cpp prints it


def describe_placement(layer_devices: dict[str, int], descriptions: dict[str, str]) -> str:
    """A model's place in words: "CPU (AMD EPYC)" when every layer is on the CPU, else each
    device with its share of the layers, GPUs first: "CUDA0 (NVIDIA L4) 31/31 layers"."""
    total = sum(layer_devices.values())
    if not total:
        return "unknown"

    def named(device: str) -> str:
        description = descriptions.get(device)
        return f"{device} ({description})" if description and description != device else device

    if set(layer_devices) == {"CPU"}:
        return named("CPU")
    order = sorted(layer_devices, key=lambda device: (device == "CPU", device))
    return ", ".join(f"{named(device)} {layer_devices[device]}/{total} layers" for device in order)


def system_info_sections(text: str) -> dict[str, dict[str, str]]:
    """llama_print_system_info()'s "CPU : SSE3 = 1 | AVX = 1 | CUDA : ARCHS = 890 | ..." as
    {"CPU": {"SSE3": "1", "AVX": "1"}, "CUDA": {"ARCHS": "890"}}."""
    sections: dict[str, dict[str, str]] = {}
    current = sections.setdefault("", {})
    for part in text.split("|"):
        if " : " in part:
            section, part = part.split(" : ", 1)
            current = sections.setdefault(section.strip(), {})
        name, equals, value = part.partition("=")
        if equals:
            current[name.strip()] = value.strip()
    return sections


def cpu_features(system_info: str) -> list[str]:
    """The CPU features a build uses, from its system info: the ones set to 1."""
    return [name for name, value in system_info_sections(system_info).get("CPU", {}).items() if value == "1"]


def text_of(value: bytes | None) -> str:
    """A C string from llama.cpp or ggml as text ("" for none)."""
    return value.decode("utf-8", "replace") if value else ""


class GgmlRegistry:
    """ggml's backend and device registry, bound on the ggml library llama_cpp loaded (a
    ctypes.CDLL). Binding raises AttributeError when the library lacks a function."""

    def __init__(self, library: ctypes.CDLL) -> None:
        library.ggml_backend_reg_count.restype = ctypes.c_size_t
        library.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
        library.ggml_backend_reg_get.restype = ctypes.c_void_p
        library.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        library.ggml_backend_reg_name.restype = ctypes.c_char_p
        library.ggml_backend_dev_count.restype = ctypes.c_size_t
        library.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        library.ggml_backend_dev_get.restype = ctypes.c_void_p
        for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(library, name).argtypes = [ctypes.c_void_p]
            getattr(library, name).restype = ctypes.c_char_p
        library.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        library.ggml_backend_dev_type.restype = ctypes.c_int
        library.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                    ctypes.POINTER(ctypes.c_size_t)]
        library.ggml_backend_dev_memory.restype = None
        library.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        library.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        library.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        library.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        library.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        library.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        library.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
        library.ggml_backend_buft_name.restype = ctypes.c_char_p
        self._library = library

    def backends(self) -> list[str]:
        """The ggml backends the build registered (CPU, CUDA, Metal, Vulkan, BLAS, ...)."""
        library = self._library
        return [text_of(library.ggml_backend_reg_name(library.ggml_backend_reg_get(index)))
                for index in range(library.ggml_backend_reg_count())]

    def devices(self) -> list[Device]:
        """Every device the build's backends see, with its memory (free and total)."""
        library = self._library
        found = []
        for index in range(library.ggml_backend_dev_count()):
            device = library.ggml_backend_dev_get(index)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            library.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
            kind = library.ggml_backend_dev_type(device)
            found.append(Device(text_of(library.ggml_backend_dev_name(device)),
                                text_of(library.ggml_backend_dev_description(device)),
                                _DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else str(kind),
                                free.value, total.value))
        return found

    def cpu_extra_buffer_types(self) -> list[str]:
        """The names of the CPU's extra buffer types (AMX, CPU_REPACK, ...): the weight layouts
        llama.cpp may load a model's weights into, for its faster kernels."""
        library = self._library
        cpu = library.ggml_backend_dev_by_type(_DEVICE_KINDS.index("CPU"))
        address = library.ggml_backend_reg_get_proc_address(library.ggml_backend_dev_backend_reg(cpu),
                                                            b"ggml_backend_dev_get_extra_bufts") if cpu else None
        if not address:
            return []
        buffer_types = _GET_EXTRA_BUFFER_TYPES(address)(cpu)
        names = []
        while buffer_types and buffer_types[len(names)]:
            names.append(text_of(library.ggml_backend_buft_name(buffer_types[len(names)])))
        return names


# ggml_backend_dev_get_extra_bufts_t: a device's extra buffer types, a NULL-terminated array
_GET_EXTRA_BUFFER_TYPES = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class Platform:
    """What llama.cpp's build runs on: its ggml backends and devices, and what it was built
    with. `llama` is llama_cpp as multiseq.llama.backend loaded it; `ready` loads its backends;
    `libggml` names the ggml library it loaded (None: not found)."""

    def __init__(self, llama, ready, libggml) -> None:
        self._llama = llama
        self._ready = ready
        self._libggml = libggml
        self._registry: GgmlRegistry | None = None

    def _ggml(self) -> GgmlRegistry | None:
        """ggml's device registry, bound on the library llama_cpp loaded; None when it cannot be
        found (tried again at the next call)."""
        if self._registry is None:
            name = self._libggml()
            try:
                self._registry = GgmlRegistry(ctypes.CDLL(name)) if name else None
            except OSError:
                return None
        return self._registry

    def backends(self) -> list[str]:
        """The ggml backends this build registered (CPU, CUDA, Metal, Vulkan, BLAS, ...)."""
        self._ready()
        registry = self._ggml()
        return registry.backends() if registry is not None else []

    def devices(self) -> list[Device]:
        """Every device the build's backends see, with its memory (free and total)."""
        self._ready()
        registry = self._ggml()
        return registry.devices() if registry is not None else []

    def cpu_extra_buffer_types(self) -> list[str]:
        """The CPU's extra buffer types this build would load weights into (AMX, CPU_REPACK, ...)."""
        self._ready()
        registry = self._ggml()
        return registry.cpu_extra_buffer_types() if registry is not None else []

    def device_descriptions(self) -> dict[str, str]:
        return {device.name: device.description for device in self.devices()}

    def free_memory(self, layer_devices: dict[str, int]) -> int | None:
        """Bytes free on the GPUs that hold a model's layers (together), else in host memory."""
        from .kv_sizing import free_host_memory

        gpus = [device for device in self.devices() if device.name in layer_devices and device.kind != "CPU"]
        if gpus:
            return sum(device.memory_free_bytes for device in gpus)
        return free_host_memory()

    def build(self) -> LlamaBuild:
        """What this llama.cpp was built with (version, GPU offload, backends, CPU features), and
        the devices it sees."""
        self._ready()
        llama = self._llama
        system_info = text_of(llama.llama_print_system_info()).strip()
        return LlamaBuild(llama_cpp_python=llama.__version__, gpu_offload=bool(llama.llama_supports_gpu_offload()),
                          max_devices=int(llama.llama_max_devices()), supports_mmap=bool(llama.llama_supports_mmap()),
                          supports_mlock=bool(llama.llama_supports_mlock()), backends=self.backends(),
                          devices=self.devices(), cpu_features=cpu_features(system_info),
                          cpu_weight_layouts=self.cpu_extra_buffer_types(), system_info=system_info)


_notices_said: set[str] = set()  # the notices already said in this process: each is said once


def _warn_once(notice: str, message: str) -> None:
    if notice not in _notices_said:
        _notices_said.add(notice)
        logging.getLogger("multiseq.backend").warning(message)


def note_no_gpu(n_gpu_layers: int) -> None:
    """Say once per process that GPU layers were asked of a build without a GPU backend."""
    _warn_once("no GPU", f"no GPU backend in this llama.cpp build (CPU only): n_gpu_layers {n_gpu_layers} (-ngl) has "
               f"no effect, the model runs on the CPU; `multiseq info` shows the build, and the README's GPU section "
               f"how to install one with a GPU backend")


def extra_layouts_are_safe(layouts: list[str]) -> bool:
    """Whether a model may load its weights into the CPU's extra layouts: not where AMX's are
    among them (a build for a CPU with AMX, on one whose kernel allows it). In this llama.cpp the
    AMX kernels stop the process with an illegal instruction at the first matrix product: they
    lose their tile configuration (llama.cpp pull request 26954)."""
    return "AMX" not in layouts


def note_weights_not_repacked() -> None:
    """Say once per process that a model was loaded without the extra layouts, for AMX's sake."""
    _warn_once("not repacked", "this llama.cpp build has AMX kernels, which stop the process on this CPU: the weights "
               "are not repacked (slower prompts); the README's 'Two commands' says how to build llama-cpp-python "
               "without AMX")
