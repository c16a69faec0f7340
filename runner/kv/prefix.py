"""Shared-prefix reuse: which prompt tokens each slot's KV holds, and where a new prompt
should start from.

With one KV stream per slot, a slot's KV is a row of positions 0..n-1. A running sequence's
slot holds the part of its prompt decoded so far; a free slot keeps what the last request it
served left in its KV (its prompt, and in the default mode its generated tokens too), so that
a later request with the same start can reuse it. A new prompt starts from the longest common prefix found in any slot:
  - in the free slot it is given: nothing to do but drop what follows the prefix;
  - in another slot: llama.cpp copies that slot's whole KV stream into the free slot (the
    copy runs inside the next llama_decode) and the copy is cut back to the prefix.
The number of resident prefixes is bounded by the number of slots, so the index is one token
array per slot, compared with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A copy costs ~1-5 ms of llama_decode time; prefilling a few tokens in a batch costs less.
MIN_COPY_TOKENS = 16
# A request whose prompt shares at least this many more tokens with a prompt still being
# prefilled than with anything resident waits for that prefill instead of computing them too.
MIN_WAIT_TOKENS = 32


def worth_waiting_for(num_in_flight: int, num_held: int) -> bool:
    """Whether a prefill under way will hold enough more of a prompt than is held already to
    wait for it rather than compute those tokens too."""
    return num_in_flight >= num_held + MIN_WAIT_TOKENS

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class KeptScores:
    """A scored prompt's log probabilities (TokenLogprobs of its tokens 1, 2, ...), kept with its
    KV: a later scored prompt that starts the same way reuses both (the rows are gone)."""

    logprobs: tuple
    num_top: int  # the alternatives each holds


def common_prefix_length(first: np.ndarray, second: np.ndarray) -> int:
    """How many leading tokens the two arrays share."""
    length = min(len(first), len(second))
    if length == 0 or first[0] != second[0]:
        return 0
    mismatches = np.flatnonzero(first[:length] != second[:length])
    return int(mismatches[0]) if mismatches.size else length


def starts_with(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    """Whether `tokens` begins with all of `prefix`."""
    return len(prefix) <= len(tokens) and common_prefix_length(tokens, prefix) == len(prefix)


class PrefixIndex:
    """The prompt tokens kept in free slots' KV, with when each was last used (for LRU)."""

    def __init__(self, num_slots: int) -> None:
        self._kept: list[np.ndarray] = [_EMPTY] * num_slots
        self._last_used: list[float] = [0.0] * num_slots
        self._scores: list[KeptScores | None] = [None] * num_slots

    def keep(self, slot: int, tokens: np.ndarray, now: float, scores: KeptScores | None = None) -> None:
        """A freed slot's KV holds `tokens` at positions 0..len-1 (and, for a scored prompt,
        the log probabilities of its tokens after the first)."""
        self._kept[slot] = tokens
        self._last_used[slot] = now
        self._scores[slot] = scores

    def take(self, slot: int) -> np.ndarray:
        """The tokens a free slot kept, now handed to a new sequence (which owns them)."""
        tokens, self._kept[slot] = self._kept[slot], _EMPTY
        self._last_used[slot] = 0.0  # an empty slot is the first to give away
        self._scores[slot] = None
        return tokens

    def take_with_scores(self, slot: int) -> tuple[np.ndarray, KeptScores | None]:
        """take(), with the log probabilities a scored prompt left with the tokens."""
        scores = self._scores[slot]
        return self.take(slot), scores

    def kept(self, slot: int) -> np.ndarray:
        return self._kept[slot]

    def scores(self, slot: int) -> KeptScores | None:
        """The log probabilities of the kept tokens after the first, when a scored prompt left them."""
        return self._scores[slot]

    def last_used(self, slot: int) -> float:
        return self._last_used[slot]

    def least_recently_used(self, slots: list[int]) -> int:
        return min(slots, key=lambda slot: self._last_used[slot])

    @property
    def num_kept_tokens(self) -> int:
        return sum(len(tokens) for tokens in self._kept)

