"""Opening a model by name: the registry, Hugging Face or a path, resolved to a GGUF file (the
models package's business) and loaded by the backend (llama.cpp's). The backend itself only
binds llama.cpp and knows nothing of names."""

from __future__ import annotations

import os

from . import models
from .backend import LlamaModel


def open_model(name_or_path: str | os.PathLike | None = None, chat_template: str | None = None,
               repack_weights: bool = True, **placement) -> LlamaModel:
    """A registry model by name (fetched into the user's cache on first use; None: the default
    model), a Hugging Face model (hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf) or a .gguf
    file by path, loaded. `placement` is n_gpu_layers, main_gpu, split_mode and tensor_split, as
    RunnerConfig has them. Raises ModelError or BackendError."""
    resolved = models.resolve(name_or_path)
    return LlamaModel(str(resolved.path), chat_template, resolved.chat_template_fallback,
                      repack_weights=repack_weights, **placement)
