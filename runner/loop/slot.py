"""A slot of the context, as one object: the sequence it holds, or while free the prefix its KV
keeps for later prompts (multiseq.kv.prefix says how a prompt finds one).

With one KV stream per slot a slot's KV is a row of positions 0..n-1. A free slot keeps what its
last request left there (its prompt, and in the default mode its generated tokens too), with
when it was last used (the least recently used goes first) and, from a scored prompt, the log
probabilities of its tokens. A sequence given the slot takes over what it kept: it starts from
a prefix of it, and the rest is cut away. The scheduler gives and frees slots; the sequence
records its slot's index (Sequence.slot) through its own methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..kv.prefix import KeptScores

if TYPE_CHECKING:
    from .sequence import Sequence

_EMPTY = np.zeros(0, dtype=np.int64)


class Slot:
    """One slot: its holder (None: free), and what a free slot's KV keeps."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.holder: Sequence | None = None
        self.kept: np.ndarray = _EMPTY  # the tokens its KV holds at positions 0..len-1, while free
        self.kept_scores: KeptScores | None = None  # a scored prompt's log probabilities of them (after the first)
        self.last_used = 0.0  # when its holder left (0: it keeps nothing, the first to give away)

    @property
    def is_free(self) -> bool:
        return self.holder is None

    def hold(self, seq: Sequence) -> tuple[np.ndarray, KeptScores | None]:
        """Give the slot to `seq`; what its KV kept until then (which the sequence now owns)."""
        taken = self.give_up_kept()
        self.holder = seq
        return taken

    def free(self, kept: np.ndarray, now: float, scores: KeptScores | None = None) -> None:
        """The holder leaves; the slot's KV keeps `kept` (and a scored prompt's `scores`)."""
        self.holder = None
        self.keep(kept, now, scores)

    def keep(self, tokens: np.ndarray, now: float, scores: KeptScores | None = None) -> None:
        self.kept, self.last_used, self.kept_scores = tokens, now, scores

    def give_up_kept(self) -> tuple[np.ndarray, KeptScores | None]:
        """What the slot kept, given up (its KV is cleared, taken over or evicted)."""
        taken = self.kept, self.kept_scores
        self.kept, self.kept_scores, self.last_used = _EMPTY, None, 0.0
        return taken


def least_recently_used(slots: Iterable[Slot]) -> Slot:
    """The slot to give away first: an empty one, else the one whose prefix is the oldest."""
    return min(slots, key=lambda slot: slot.last_used)
