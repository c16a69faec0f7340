"""The one error of the models package."""

from __future__ import annotations


class ModelError(Exception):
    """A model that cannot be used: unknown, missing, corrupt or not fetchable. One line."""
