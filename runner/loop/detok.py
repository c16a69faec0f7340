"""Incremental detokenizing and stop-string matching for streamed output.

Token pieces are bytes; a UTF-8 character may be split across tokens, so bytes are fed to an
incremental decoder that holds back an incomplete character until its last byte arrives.
Stop strings are matched on the decoded text; text that might be the start of a stop string
is held back until it is either completed (and dropped) or ruled out (and released).
"""

from __future__ import annotations

import codecs


class IncrementalDetokenizer:
    """Bytes in, complete characters out; never emits half a character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    def end(self) -> None:
        """The end of the stream. Bytes of a character that never completed (generation
        stopped inside it) are dropped: they would only show as U+FFFD."""
        self._decoder.reset()


class StopMatcher:
    """Finds the first stop string in a stream of text, holding back possible partial matches."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._held = ""
        self.matched: str | None = None  # the stop string that was reached (the earliest in the text)

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached).

        When a stop string is reached, the text before it is returned and the stop string
        itself and anything after it are dropped.
        """
        if not self._stops:
            return text, False
        buffer = self._held + text
        hits = [(index, stop) for stop in self._stops if (index := buffer.find(stop)) >= 0]
        if hits:
            self._held = ""
            first, self.matched = min(hits, key=lambda hit: hit[0])
            return buffer[:first], True
        keep = self._longest_partial_match(buffer)
        self._held = buffer[len(buffer) - keep:]
        return buffer[: len(buffer) - keep], False

    @property
    def held(self) -> str:
        """Text received but not yet safe to emit: it may be the start of a stop string."""
        return self._held

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_partial_match(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest


class TextAssembler:
    """Token bytes in, emit-ready text out, for one sequence: detokenizer then stop matcher."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._detok = IncrementalDetokenizer()
        self._stops = StopMatcher(stops)

    def feed(self, piece: bytes) -> tuple[str, bool]:
        return self._stops.feed(self._detok.feed(piece))

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the text (None: none did)."""
        return self._stops.matched

    def flush(self) -> str:
        """The text held back at the end of generation (no stop string can follow any more)."""
        self._detok.end()
        return self._stops.flush()
