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
    handles = (llama.llama_adapter_lora_p_ctypes * len(adapters))(*(handle for handle, _ in adapters))
    scales = (ctypes.c_float * len(adapters))(*(scale for _, scale in adapters))
    if llama.llama_set_adapters_lora(ctx, handles if adapters else None, len(adapters), scales if adapters else None):
        raise BackendError("llama.cpp could not set the LoRA adapters on the context")


class AdapterSets:
    """The adapter sets a context runs steps through: set 0 is `base` (the whole model's, maybe
    none), set i is `base` with the i-th of `named`; `use` switches the context between steps."""

    def __init__(self, llama: ModuleType, load: Any, base: Sequence[tuple[str, float]],
                 named: Sequence[tuple[str, float]] = ()) -> None:
        self._llama = llama
        loaded = [(load(path), scale) for path, scale in base]
        self.sets = [loaded] + [loaded + [(load(path), scale)] for path, scale in named]
        self.current = 0
        self._ctx = None

    def bind(self, ctx: Any) -> None:
        """A new context (which holds no adapters): the current set applied to it."""
        self._ctx = ctx
        if self.sets[self.current]:
            apply_adapters(self._llama, ctx, self.sets[self.current])

    def use(self, index: int) -> None:
        if index != self.current:
            self.current = index
            apply_adapters(self._llama, self._ctx, self.sets[index])
