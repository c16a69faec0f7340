"""What every part of the Files and Batch APIs shares: the rules batch lines run by, ids,
timestamps and the shape of a batch's errors."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..config import OverflowPolicy, SamplingParams


@dataclass(frozen=True)
class BatchRules:
    """How batch lines run: what the server applies to its interactive requests too."""

    model_name: str
    defaults: SamplingParams
    overflow: OverflowPolicy
    max_lines: int  # requests a batch may hold


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def batch_error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict[str, Any]:
    """One entry of a batch's `errors` (OpenAI's shape)."""
    return {"code": code, "message": message, "param": param, "line": line}
