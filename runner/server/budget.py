"""A memory budget for the models a server loads (serve --models-memory): what each model takes
is computed before its first load from its GGUF's metadata (multiseq.loading's memory_of), and
a model loads only where the process stays within the budget:

    the process's own memory (measured before any model loads, llama.cpp's library in)
    + what each loaded model takes (weights, KV pool, RAM tier at its bound, a step's logits)
    + what each model that ever loaded or was prepared keeps for the process (its constraints'
      tokenizer: built once per file and kept across unloads, 145 MiB on Gemma 3's vocabulary)

The loader (ModelLoader) unloads least recently used idle models until a load fits."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("multiseq.server")


@dataclass(frozen=True)
class ModelMemory:
    """What a model takes, and the config to load it with (its default pool sized within the budget)."""

    loaded_bytes: int  # while it is loaded
    kept_bytes: int  # for the process, once it has loaded or been prepared
    config: Any


class MemoryBudget:
    """The bytes a server's process may hold with its models loaded, and each model's share."""

    def __init__(self, limit_bytes: int, measure: Callable[[Any, int], ModelMemory]) -> None:
        self.limit_bytes = limit_bytes
        self.measure = measure  # a model's ModelMemory from its config and the bytes one model may take
        self.baseline_bytes: int | None = None  # the process's own (set at the first measure)
        self.of: dict[str, ModelMemory] = {}  # by model name, once measured
        self.kept: set[str] = set()  # models whose kept bytes the process holds
        self._measuring: dict[str, asyncio.Future] = {}

    @property
    def room_bytes(self) -> int:
        """What one model alone may take."""
        return self.limit_bytes - (self.baseline_bytes or process_resident_bytes())

    async def measured(self, name: str, config: Any) -> ModelMemory:
        """The model's memory, measured once (on a thread: it opens the GGUF's vocabulary);
        callers at the same time share one measure."""
        if name in self.of:
            return self.of[name]
        if name not in self._measuring:
            self._measuring[name] = asyncio.ensure_future(asyncio.to_thread(self.measure, config, self.room_bytes))
        try:
            memory = await asyncio.shield(self._measuring[name])
        finally:
            self._measuring.pop(name, None)
        if self.baseline_bytes is None:  # now that llama.cpp's library is in, before any model loads
            self.baseline_bytes = process_resident_bytes()
            logger.info("--models-memory %s: the server itself holds %s before its models", size_text(self.limit_bytes),
                        size_text(self.baseline_bytes))
        if name not in self.of:
            self.of[name] = memory
            logger.info("%s takes %s loaded, and keeps %s for the process (--models-memory)", name,
                        size_text(memory.loaded_bytes), size_text(memory.kept_bytes))
        return self.of[name]

    def fits(self, name: str, beside: Iterable[str], kept_only: bool = False) -> bool:
        """Whether model `name` (measured) fits beside the loaded models `beside`: loaded, or,
        with kept_only, prepared alone (what it keeps for the process)."""
        memory = self.of[name]
        needed = (0 if name in self.kept else memory.kept_bytes) + (0 if kept_only else memory.loaded_bytes)
        return self.used_bytes(beside) + needed <= self.limit_bytes

    def used_bytes(self, loaded: Iterable[str]) -> int:
        """The process's own, the loaded models', and what every kept model keeps."""
        return (self.baseline_bytes or 0) + sum(self.of[name].loaded_bytes for name in loaded if name in self.of) + \
            sum(self.of[name].kept_bytes for name in self.kept if name in self.of)

    def too_large_alone(self, name: str) -> str | None:
        """Why model `name` could never load within the budget (None: it can, alone)."""
        memory = self.of[name]
        needed = memory.loaded_bytes + memory.kept_bytes
        if needed <= self.room_bytes:
            return None
        return (f"it needs {size_text(needed)} loaded, more than --models-memory leaves to one model "
                f"({size_text(self.room_bytes)} of {size_text(self.limit_bytes)}); give it a smaller context (-c), "
                f"fewer slots or a smaller --cache-ram")


def process_resident_bytes() -> int:
    """This process's resident set now (Linux's /proc; elsewhere its peak so far)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource  # Unix without /proc: ru_maxrss is KiB on Linux, bytes on macOS

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def size_text(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.0f} MiB"
