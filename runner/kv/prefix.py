"""Shared-prefix reuse: how a new prompt finds the longest prefix of it some slot's KV holds,
and when that is worth a copy or a wait.

With one KV stream per slot, a slot's KV is a row of positions 0..n-1. A running sequence's
slot holds the part of its prompt decoded so far; a free slot keeps what the last request it
served left in its KV (multiseq.loop.slot), so that a later request with the same start can
reuse it. A new prompt starts from the longest common prefix found in any slot:
  - in the free slot it is given: nothing to do but drop what follows the prefix;
  - in another slot: llama.cpp copies that slot's whole KV stream into the free slot (the
    copy runs inside the next llama_decode) and the copy is cut back to the prefix.
The number of resident prefixes is bounded by the number of slots: one token array per slot,
compared with numpy.
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
