"""Incremental detokenizing and stop-string matching for streamed output.

Token pieces are bytes; a UTF-8 character may be split across tokens, so bytes are fed to an
incremental decoder that holds back an incomplete character until its last byte arrives.
Stop strings are matched on the decoded text; text that might be the start of a stop string
is held back until it is either completed (and dropped) or ruled out (and released). A code
completion may also end where a line is indented less than the block being written (llama-server's
n_indent): the whitespace that starts a line is held back until the line's first character shows
whether it goes on.
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


class IndentLimit:
    """Ends text at the first line, after the first, indented by fewer than `min_indent` spaces
    or tabs (an empty line counts as none): the completion of a block ends where the block does.
    That line's indentation is kept, its text dropped, as llama-server's n_indent does."""

    def __init__(self, min_indent: int) -> None:
        self.min_indent = min_indent
        self._in_indentation = False  # inside the whitespace that starts a line after the first
        self._held = ""  # that whitespace, until the line's first character shows it is enough
        self.reached = False

    def feed(self, text: str) -> str:
        """The text that may go out; after the limit is reached, nothing more."""
        if self.reached or self.min_indent <= 0 or (not self._in_indentation and "\n" not in text):
            return "" if self.reached else text
        out = []
        for char in text:
            if self._in_indentation:
                if char in " \t":
                    self._held += char
                    continue
                out.append(self._held)
                self._held, self._in_indentation = "", False
                if len(out[-1]) < self.min_indent:
                    self.reached = True
                    break
            out.append(char)
            self._in_indentation = char == "\n"
        return "".join(out)

    def flush(self) -> str:
        """Whitespace held at the end of the output (it ended there, inside a line's indentation)."""
        held, self._held = ("" if self.reached else self._held), ""
        return held


class TextAssembler:
    """Token bytes in, emit-ready text out, for one sequence: detokenizer, stop matcher, then
    the indentation limit (min_indent 0: none)."""

    def __init__(self, stops: tuple[str, ...], min_indent: int = 0) -> None:
        self._detok = IncrementalDetokenizer()
        self._stops = StopMatcher(stops)
        self._indent = IndentLimit(min_indent)

    def feed(self, piece: bytes) -> tuple[str, bool]:
        text, stopped = self._stops.feed(self._detok.feed(piece))
        return self._indent.feed(text), stopped

    @property
    def reached_indent_limit(self) -> bool:
        return self._indent.reached

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the text (None: none did)."""
        return self._stops.matched

    def flush(self) -> str:
        """The text held back at the end of generation (no stop string can follow any more)."""
        self._detok.end()
        return self._indent.feed(self._stops.flush()) + self._indent.flush()
