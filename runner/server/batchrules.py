"""What every part of the Files and Batch APIs shares: the rules batch lines run by, ids,
timestamps and the shape of a batch's errors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import OverflowPolicy, SamplingParams


@dataclass(frozen=True)
class BatchRules:
    """How batch lines run: what the server applies to its interactive requests too."""

    model_name: str  # the first model: a batch whose lines name none runs on it
    defaults: SamplingParams
    overflow: OverflowPolicy
    max_lines: int  # requests a batch may hold
    # The served model a line's `model` names (its own name, an alias, NAME:latest), None when
    # none is; where not given, the first model alone is served.
    served_name: Callable[[str], str | None] | None = None

    def model_named(self, name: str) -> str | None:
        if self.served_name is not None:
            return self.served_name(name)
        return self.model_name if name == self.model_name else None


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def batch_error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict[str, Any]:
    """One entry of a batch's `errors` (OpenAI's shape)."""
    return {"code": code, "message": message, "param": param, "line": line}
