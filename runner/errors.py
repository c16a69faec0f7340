"""Errors a backend raises, importable without loading llama.cpp (the fake backend uses them)."""


class BackendError(Exception):
    """The model or context could not be used (load failure, bad template, fatal decode)."""


class NoKvSlot(BackendError):
    """llama_decode found no KV room for the batch; a smaller batch may succeed."""
