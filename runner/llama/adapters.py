"""LoRA adapters (llama.cpp's): loaded once per file on a model, and applied with their scales
to a whole context, every sequence of every step (llama-server's --lora and --lora-scaled).
Functions over the `llama` binding the backend passes in (only the backend imports llama_cpp)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..errors import BackendError
from .log import capturing_llama_log


def load_adapter(llama: ModuleType, model_handle: Any, path: str) -> Any:
    """The adapter in `path`, loaded for the model (freed with it), or a BackendError saying why
    llama.cpp refused it (not an adapter, another architecture, shapes that do not match)."""
    with capturing_llama_log() as log:
        adapter = llama.llama_adapter_lora_init(model_handle, str(path).encode())
    if not adapter:
        cause = f": {log.errors[-1]}" if log.errors else ""
        raise BackendError(f"llama.cpp could not load the LoRA adapter {path}{cause}")
    return adapter


def apply_adapters(llama: ModuleType, ctx: Any, adapters: Sequence[tuple[Any, float]]) -> None:
    """Set the adapters (handle, scale) on a context; none: the model alone."""
    if not adapters:
        return
    handles = (llama.llama_adapter_lora_p_ctypes * len(adapters))(*(handle for handle, _ in adapters))
    scales = (ctypes.c_float * len(adapters))(*(scale for _, scale in adapters))
    if llama.llama_set_adapters_lora(ctx, handles, len(adapters), scales) != 0:
        raise BackendError("llama.cpp could not apply the LoRA adapters to the context")
