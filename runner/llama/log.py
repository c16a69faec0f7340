"""llama.cpp's log: forwarded to Python's logging, captured while a model loads or a context is
created, and read for what it says about where things run.

Imports nothing of llama_cpp: multiseq.llama.backend installs `forward_llama_log` as llama.cpp's log
callback and wraps its loads in `capturing_llama_log`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

logger = logging.getLogger("multiseq.llama")

_GGML_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml's WARN and ERROR
_GGML_DEBUG, _GGML_INFO = 1, 2
_capture_lock = threading.Lock()
_capture: LlamaLog | None = None  # what llama.cpp logs while a model loads or a context is created

# What llama.cpp says, at debug and info level, about where things run (llama-model.cpp's
# load_tensors and llama-context.cpp; the lines are the same on every backend).
_LAYER_DEVICE = re.compile(r"load_tensors: layer +\d+ assigned to device (\S+?),")
_FLASH_ATTENTION_ASKED = re.compile(r"llama_context: flash_attn += (\w+)")
_FLASH_ATTENTION_RESOLVED = re.compile(r"Flash Attention (enabled|not supported)")


@dataclass
class LlamaLog:
    """llama.cpp's log lines during one model load or context creation: its errors, which a
    failure reports, and its debug and info lines, which say where layers went."""

    errors: list[str]
    lines: list[str]


def forward_llama_log(level: int, text: bytes, _user_data) -> None:
    """llama.cpp's log callback: a capture under way takes the debug and info lines (and the
    errors, said as warnings); warnings and errors go to the `multiseq.llama` logger."""
    capture = _capture
    if capture is not None and level in (_GGML_DEBUG, _GGML_INFO) and text:
        capture.lines.append(text.decode("utf-8", "replace"))
        return
    python_level = _GGML_LOG_LEVELS.get(level)
    if python_level is None or not text:
        return
    message = text.decode("utf-8", "replace").rstrip()
    if capture is not None and python_level >= logging.ERROR:
        # A failed load is reported by its BackendError, in one line naming this cause; the
        # log lines themselves are only warnings then (batch-run shows them with -v).
        capture.errors.append(message)
        python_level = logging.WARNING
    logger.log(python_level, message)


@contextmanager
def capturing_llama_log() -> Iterator[LlamaLog]:
    """While a model loads or a context is created, collect what llama.cpp logs (one at a time)."""
    global _capture
    with _capture_lock:
        _capture = LlamaLog([], [])
        try:
            yield _capture
        finally:
            _capture = None


def layer_devices(lines: list[str]) -> dict[str, int]:
    """How many layers llama.cpp put on each device (the output layer counted, as llama.cpp
    counts it), by device name: the placement it chose, read back from what it reported."""
    return dict(Counter(match.group(1) for line in lines if (match := _LAYER_DEVICE.search(line))))


def flash_attention_used(lines: list[str]) -> str:
    """"enabled" or "disabled", as llama.cpp reported it while making a context: what was asked,
    or what "auto" became."""
    asked = resolved = None
    for line in lines:
        if match := _FLASH_ATTENTION_ASKED.search(line):
            asked = match.group(1)
        elif match := _FLASH_ATTENTION_RESOLVED.search(line):
            resolved = "enabled" if match.group(1) == "enabled" else "disabled"
    return resolved or asked or "unknown"
