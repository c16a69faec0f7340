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


class RequestFault(Exception):
    """An unexpected exception while one request's output was handled (sampling, constraining,
    detokenizing, parsing, finishing, delivering): a bug that fails that request alone, with a
    message naming the stage."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"internal error while {stage}: {first_line(cause)}")
        self.stage = stage


def request_fault(stage: str, error: BaseException) -> RequestFault:
    """`error` as a RequestFault of `stage` (one raised deeper keeps the stage it named)."""
    return error if isinstance(error, RequestFault) else RequestFault(stage, error)


class EngineFailure(Exception):
    """The step loop cannot go on: a failure that is no one request's (a backend that fails
    every decode, a bug outside any one request). Every request ends, and the runner stops."""
