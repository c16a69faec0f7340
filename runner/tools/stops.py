"""Stop strings searched in short windows of new text: whether one occurs, and how long an end
of the text may still grow into one. The reader (reader.py) asks both for every piece it takes
without a parse, and the families ask the second for what they hold back, so both agree."""

from __future__ import annotations

import re
from functools import lru_cache


class Stops:
    """A set of stop strings, made to be searched in short windows of new text: whether one
    occurs, and how long an end may still grow into one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.pattern = re.compile("|".join(re.escape(stop) for stop in sorted(set(stops), key=len, reverse=True))
                                  ) if stops else None
        self._prefixes = frozenset(stop[:size] for stop in stops for size in range(1, len(stop)))
        self._firsts = "".join(sorted({stop[0] for stop in stops if len(stop) > 1}))
        # Where none of the first characters is in the text's last characters, nothing waits:
        # one search in C answers most pieces of prose.
        self._a_first = re.compile("[" + "".join(re.escape(first) for first in self._firsts) + "]") \
            if self._firsts else None
        self._longest = max((len(stop) for stop in stops), default=0)

    def occur_in(self, text: str) -> bool:
        pattern = self.pattern
        return pattern is not None and pattern.search(text) is not None

    def held(self, text: str) -> int:
        """How many characters at the end of `text` may begin a stop (the longest such end)."""
        a_first = self._a_first
        if a_first is None:
            return 0
        start = len(text) - self._longest + 1
        if start < 0:
            start = 0
        if a_first.search(text, start) is None:
            return 0
        best = len(text)
        for first in self._firsts:
            found = text.find(first, start, best)
            while found >= 0:
                if text[found:] in self._prefixes:
                    best = found
                    break
                found = text.find(first, found + 1, best)
        return len(text) - best


@lru_cache(maxsize=512)
def stops_of(stops: tuple[str, ...]) -> Stops:
    return Stops(stops)
