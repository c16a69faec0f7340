"""How large a KV pool to make when the user gives no size: from the model's trained context
and the memory this machine has free (llama-server's --fit does the same for its context).

Every slot may hold a session of the model's trained context (past it a model writes worse, so
a session is capped there, as llama-server caps a slot): the pool is n_ctx_train x slots, unless
that would take more than
MEMORY_SHARE of the memory free once the model is loaded (host RAM; a GPU's memory when the
layers go there), in which case it is what that share holds. Either way the user is told, in
tokens and in agent sessions of Claude Code's size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Of the memory free once the model is loaded, the most a KV pool sized by default may take: the
# rest stays for the host-memory tier of saved conversations, the process and the machine.
MEMORY_SHARE = 0.5
# Claude Code 2.1.197's first request (24 tools, its system prompt): 6,555 tokens on SmolLM2's
# tokenizer. A pool's size is told in sessions of that size too.
AGENT_SESSION_TOKENS = 6555
POOL_GRANULE = 256  # llama.cpp rounds a context up to a multiple of 256


@dataclass(frozen=True)
class PoolSize:
    """A default pool: its tokens, the bytes they take, and what bounded it."""

    tokens: int
    num_bytes: int
    bounded_by: str  # "the trained context" or "memory"
    session_tokens: int  # the most one session holds: the trained context, or the pool if smaller

    @property
    def agent_sessions(self) -> int:
        """Sessions of Claude Code's first-prompt size the pool holds without sharing a cell."""
        return self.tokens // AGENT_SESSION_TOKENS


def default_pool(n_ctx_train: int, num_slots: int, bytes_per_token: int, free_bytes: int | None) -> PoolSize:
    """The pool for num_slots sessions of up to n_ctx_train tokens, within MEMORY_SHARE of
    free_bytes (None: unknown, no bound). At least one full session, whatever the memory."""
    wanted = n_ctx_train * num_slots
    if free_bytes is None or wanted * bytes_per_token <= free_bytes * MEMORY_SHARE:
        tokens, bounded_by = wanted, "the trained context"
    else:
        fitting = int(free_bytes * MEMORY_SHARE) // bytes_per_token // POOL_GRANULE * POOL_GRANULE
        tokens, bounded_by = max(fitting, min(n_ctx_train, wanted)), "memory"
    return PoolSize(tokens, tokens * bytes_per_token, bounded_by, min(n_ctx_train, tokens))


def free_host_memory() -> int | None:
    """Bytes of host memory available now (Linux's MemAvailable; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
