"""Errors a backend or a constraint raises, importable without loading llama.cpp (the fake backend
uses them)."""


class BackendError(Exception):
    """The model or context could not be used (load failure, bad template, fatal decode)."""


class NoKvSlot(BackendError):
    """llama_decode found no KV room for the batch; a smaller batch may succeed."""


class ConstraintError(ValueError):
    """A schema or grammar that cannot be compiled (in time), or output the matcher refused."""


def first_line(message: object) -> str:
    """The first line of an error or message, for a one-line report ("unknown error" when
    it says nothing; an exception with no text is named by its type)."""
    text = str(message).strip()
    if not text:
        return type(message).__name__ if isinstance(message, BaseException) else "unknown error"
    return text.splitlines()[0]
