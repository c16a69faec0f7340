"""Plain helpers shared by test modules, so that no test module imports another."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_lines(path: Path, count: int, process: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until `path` has `count` lines; fail at once if `process` (which writes it) ends
    first, and after `timeout` seconds if it never gets there."""
    deadline = time.monotonic() + timeout
    while count_lines(path) < count:
        assert process.poll() is None, process.stderr.read() if process.stderr else process.returncode
        assert time.monotonic() < deadline, f"{path} never reached {count} lines"
        time.sleep(0.02)
