"""The waiting queue: requests in the order they are admitted, by priority, then by age.

One FIFO queue per priority; the highest priority goes first. So that no request waits behind
an unbounded stream of newer ones of a higher priority, a request that has waited longer than
STARVATION_SECONDS goes before any newer one, whatever their priorities (it is admitted, never
preempting anything: only a higher priority preempts). A request preempted from its slot comes
back at its place by age within its priority, ahead of newer ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sequence import Sequence

STARVATION_SECONDS = 30.0


class WaitingQueue:
    def __init__(self) -> None:
        self._queues: dict[int, deque[Sequence]] = {}  # by priority, each oldest first

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def __bool__(self) -> bool:
        return any(self._queues.values())

    def __iter__(self) -> Iterator[Sequence]:
        """By priority, highest first, each oldest first (starvation aside)."""
        for priority in sorted(self._queues, reverse=True):
            yield from self._queues[priority]

    @property
    def highest_priority(self) -> int | None:
        return max((priority for priority, queue in self._queues.items() if queue), default=None)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self._queues.get(seq.priority, ())

    def append(self, seq: Sequence) -> None:
        """A new request: last of its priority."""
        self._queues.setdefault(seq.priority, deque()).append(seq)

    def put_back(self, seq: Sequence) -> None:
        """A preempted request: at its place by age within its priority."""
        queue = self._queues.setdefault(seq.priority, deque())
        position = next((index for index, other in enumerate(queue) if other.submitted_at > seq.submitted_at),
                        len(queue))
        queue.insert(position, seq)

    def remove(self, seq: Sequence) -> None:
        self._queues[seq.priority].remove(seq)

    def clear(self) -> list[Sequence]:
        """Take everything out (in admission order)."""
        drained = list(self)
        self._queues.clear()
        return drained

    def in_admission_order(self, now: float, limit: int) -> list[Sequence]:
        """The first `limit` requests in the order they are to be admitted: those that waited
        too long first (oldest first), then by priority and age."""
        starved = sorted((queue[0] for queue in self._queues.values()
                          if queue and now - queue[0].submitted_at > STARVATION_SECONDS),
                         key=lambda seq: seq.submitted_at)
        rest = (seq for seq in self if seq not in starved)
        return starved + list(islice(rest, max(0, limit - len(starved))))
