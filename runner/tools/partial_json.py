"""The settled start of a JSON value's normalized text, from the start of the text that writes it.

Families that hand a call's arguments out normalized (`json.dumps(value, ensure_ascii=False)` of
what the model wrote, family.arguments_json) can stream them only as that normalized text. Read
from the start of the JSON the model is writing, `settled_prefix` gives the part of the
normalized text no later text can change: brackets, separators and keys as json.dumps writes
them, a string's characters as they come (each escaped as json.dumps escapes it), a number or a
literal once it has ended. It is always a prefix of the normalized text of the whole value,
which is the property a stream's deltas rely on (tests/test_partial_json.py checks it under
cuts anywhere). Where the text stops being JSON it stops growing. A key written twice is the
one case where what it gave is no prefix (json.loads keeps the last value where the first stood):
it stops at the second, and the reader, finding the whole call other than what it streamed,
sends the call whole as a call of its own.
"""

from __future__ import annotations

import functools
import json
import re

_WHITESPACE = " \t\n\r"
_ENDS_SCALAR = _WHITESPACE + ",]}"
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def settled_prefix(text: str) -> str:
    """The normalized text of the JSON value `text` begins, as far as `text` settles it."""
    return _Reader(text).read()


@functools.lru_cache(maxsize=256)
def _dumped(char: str) -> str:
    return json.dumps(char, ensure_ascii=False)[1:-1]


class _Reader:
    """One pass over the text: each container's state on a stack, the output as it settles."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.out: list[str] = []
        # Per open container: its kind ("{" or "["), what comes next ("value", "key", ":",
        # ",": a separator or the close), and for an object the keys seen.
        self.stack: list[list] = []

    def read(self) -> str:
        expecting = "value"
        while True:
            self._skip_space()
            if self.at >= len(self.text):
                break
            char = self.text[self.at]
            if expecting == "value":
                if not self._value(char):
                    break
            elif expecting == "key":
                if char == "}" and not self.stack[-1][2]:  # an empty object
                    self._close("}")
                elif char != '"' or not self._key():
                    break
            elif expecting == ":":
                if char != ":":
                    break
                self.at += 1
                self.out.append(": ")
                self.stack[-1][1] = "value"
            else:  # "," or the container's close
                kind = self.stack[-1][0]
                if char == ",":
                    self.at += 1
                    self.out.append(", ")
                    self.stack[-1][1] = "key" if kind == "{" else "value"
                elif char == ("}" if kind == "{" else "]"):
                    self._close(char)
                else:
                    break
            if not self.stack:
                break  # the value is whole
            expecting = self.stack[-1][1]
        return "".join(self.out)

    def _skip_space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in _WHITESPACE:
            self.at += 1

    def _value(self, char: str) -> bool:
        """One value (or the opening of a container) from here; False where it cannot go on."""
        if char in "{[":
            self.at += 1
            self.out.append(char)
            self.stack.append([char, "key" if char == "{" else "value", set()])
            return True
        if char == "]" and self.stack and self.stack[-1][0] == "[" and self.out[-1] == "[":
            self._close("]")  # an empty array
            return True
        if char == '"':
            decoded = self._string()
            if decoded is None:
                return False
        elif not self._scalar():
            return False
        if self.stack:
            self.stack[-1][1] = ","
        return True

    def _key(self) -> bool:
        start = len(self.out)
        decoded = self._string()
        if decoded is None:
            return False
        keys = self.stack[-1][2]
        if decoded in keys:  # json.loads keeps the last value where the first stood: no prefix of that
            del self.out[start:]
            return False
        keys.add(decoded)
        self.stack[-1][1] = ":"
        return True

    def _close(self, char: str) -> None:
        self.at += 1
        self.out.append(char)
        self.stack.pop()
        if self.stack:
            self.stack[-1][1] = ","

    def _scalar(self) -> bool:
        """A number or literal, once something after it shows that it ended."""
        found = _SCALAR.match(self.text, self.at)
        if found is None or found.end() == len(self.text) or self.text[found.end()] not in _ENDS_SCALAR:
            return False  # not JSON, or it may go on (1.5e, 1.5e+)
        self.at = found.end()
        self.out.append(json.dumps(json.loads(found.group())))
        return True

    def _string(self) -> str | None:
        """A string's characters as they settle (its closing quote, where it came); its decoded
        text when whole, else None (the text ended in it, or an escape is not JSON)."""
        text, position = self.text, self.at + 1
        self.out.append('"')
        decoded: list[str] = []
        while position < len(text):
            plain = _PLAIN.match(text, position)  # a run of plain characters: json.dumps writes them as they are
            if plain.end() > position:
                decoded.append(plain.group())
                self.out.append(plain.group())
                position = plain.end()
                continue
            char = text[position]
            if char == '"':
                self.out.append('"')
                self.at = position + 1
                return "".join(decoded)
            if char != "\\":
                return None  # a control character: not JSON
            escaped, length = _escape(text, position)
            if escaped is None:
                return None
            decoded.append(escaped)
            self.out.append(_dumped(escaped))
            position += length
        return None


def _escape(text: str, position: int) -> tuple[str | None, int]:
    """The character the escape at `position` writes, and its length (None: not whole, or not
    JSON). A surrogate pair is one character, written by two escapes."""
    code = text[position + 1:position + 2]
    if code in _ESCAPES:
        return _ESCAPES[code], 2
    if code != "u" or len(text) < position + 6:
        return None, 0
    try:
        value = int(text[position + 2:position + 6], 16)
    except ValueError:
        return None, 0
    if 0xD800 <= value < 0xDC00:  # the high half: the low one must follow
        low = text[position + 6:position + 12]
        if len(low) < 6 or not low.startswith("\\u"):
            return None, 0
        try:
            second = int(low[2:], 16)
        except ValueError:
            return None, 0
        if not 0xDC00 <= second < 0xE000:
            return None, 0
        return chr(0x10000 + ((value - 0xD800) << 10) + (second - 0xDC00)), 12
    return chr(value), 6
