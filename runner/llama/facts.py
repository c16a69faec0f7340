"""What a loaded model is, in the words model lists use (Ollama's /api/tags, /api/show, /api/ps):
its architecture, its size in parameters, its weights' type and bytes, its file."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelFacts:
    path: str
    architecture: str  # general.architecture ("llama", "gemma3"; "" when the GGUF does not say)
    num_params: int
    weight_bytes: int  # the weights' bytes, as loaded
    weight_type: str  # the weights' type, as llama.cpp names it ("Q4_1", "F16")
    size_label: str  # the GGUF's general.size_label ("135M"), else the count rounded ("134.5M")
    context_length: int  # the context it was trained with (0: not said)
    modified_at: float  # the file's modification time (seconds since the epoch)


def read_model_facts(llama: Any, handle: Any, path: str) -> ModelFacts:
    """The facts of a model llama.cpp loaded (`llama`: the bindings module)."""
    def meta(key: str) -> str:
        buffer = ctypes.create_string_buffer(256)
        found = llama.llama_model_meta_val_str(handle, key.encode(), buffer, len(buffer)) >= 0
        return buffer.value.decode("utf-8", "replace") if found else ""

    description = ctypes.create_string_buffer(256)
    llama.llama_model_desc(handle, description, len(description))
    architecture = meta("general.architecture")
    num_params = int(llama.llama_model_n_params(handle))
    context = meta(f"{architecture}.context_length")
    return ModelFacts(path, architecture, num_params, int(llama.llama_model_size(handle)),
                      weight_type(description.value.decode("utf-8", "replace")),
                      meta("general.size_label") or count_label(num_params),
                      int(context) if context.isdigit() else 0, _modified_at(path))


def weight_type(description: str) -> str:
    """The weights' type in llama.cpp's description of a model ("gemma3 270M Q4_K - Medium") as
    quantizations are named (Q4_K_M)."""
    name = description.split(" ", 2)[-1]
    base, _, size = name.partition(" - ")
    return base + {"Small": "_S", "Medium": "_M", "Large": "_L"}.get(size, "")


def count_label(count: int) -> str:
    """A parameter count as model names write it: 134.5M, 1.7B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + unit
    return str(count)


def _modified_at(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
