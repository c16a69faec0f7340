"""The error a request's or a line's problem is raised as (multiseq.formats.fields re-exports it)."""

from __future__ import annotations


class ItemError(ValueError):
    """One line's problem, said in words a user can act on; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
