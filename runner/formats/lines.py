"""Prompt files as bytes: lines read lazily, decoded one at a time, counted cheaply.

A prompts file may be far larger than memory and may hold bytes that are not UTF-8. Nothing
here keeps more than one line (or one block) at a time, and a line that does not decode is
that line's problem: decode_line says which byte and why, and the caller makes it the line's
error. sniff_text() looks at the first block only, to refuse a file that is not text at all
(an image, an archive, a UTF-16 file) before anything runs.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK_BYTES = 1 << 20  # how much is read at a time when counting, and what sniff_text looks at
UTF8_BOM = codecs.BOM_UTF8
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
# A first block in which more than this share of the bytes is not UTF-8 is not a text file;
# below it, the few bad lines (a Latin-1 accent here and there) become line errors.
MAX_UNDECODABLE_SHARE = 0.1
_BLANK_LINE = re.compile(rb"^[ \t\r\x0b\x0c]*\n", re.MULTILINE)  # what bytes.strip() removes


class NotTextError(ValueError):
    """The file is not a text file at all: nothing in it can be read as prompts."""


@dataclass(frozen=True, slots=True)
class RawLine:
    """One line of a file as bytes, with its 1-based number and the offset of its first byte."""

    number: int
    offset: int
    data: bytes

    @property
    def is_blank(self) -> bool:
        return not self.data.strip()


class LineDecodeError(ValueError):
    """A line whose bytes are not UTF-8; the message names the byte, its offset and the reason."""


def iter_lines(path: Path) -> Iterator[RawLine]:
    """Every line of the file, lazily, as bytes (a UTF-8 byte order mark on the first line is
    dropped). Holds one line at a time."""
    offset = 0
    with path.open("rb") as handle:
        for number, data in enumerate(handle, start=1):
            line_offset = offset
            offset += len(data)
            if number == 1 and data.startswith(UTF8_BOM):
                data = data[len(UTF8_BOM):]
                line_offset += len(UTF8_BOM)
            yield RawLine(number, line_offset, data)


def decode_line(line: RawLine) -> str:
    """The line as text, or LineDecodeError saying where its bytes stop being UTF-8."""
    try:
        return line.data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = line.data[error.start]
        raise LineDecodeError(
            f"not valid UTF-8: byte 0x{bad:02x} at byte {error.start + 1} of the line "
            f"(file offset {line.offset + error.start}): {error.reason}") from None


def count_items(path: Path) -> int:
    """How many non-blank lines (items) the file has, counted block by block in bytes: fast
    whatever the file's size, and nothing is kept. Blank means ASCII whitespace only, as
    RawLine.is_blank says."""
    count = 0
    carried_blank, carried_any = True, False  # the line cut by the previous block's end
    with path.open("rb") as handle:
        block = handle.read(BLOCK_BYTES)
        if block.startswith(UTF8_BOM):
            block = block[len(UTF8_BOM):] or handle.read(BLOCK_BYTES)
        while block:
            newline = block.find(b"\n")
            if newline < 0:
                carried_blank, carried_any = carried_blank and not block.strip(), True
            else:
                count += not (carried_blank and not block[:newline].strip())
                last = block.rfind(b"\n")
                whole_lines = block[newline + 1:last + 1]
                count += whole_lines.count(b"\n") - _BLANK_LINE.subn(b"", whole_lines)[1]
                tail = block[last + 1:]
                carried_blank, carried_any = not tail.strip(), bool(tail)
            block = handle.read(BLOCK_BYTES)
    return count + (carried_any and not carried_blank)


def sniff_text(path: Path) -> None:
    """Raise NotTextError when the file's first block shows it is not UTF-8 text: NUL bytes
    (binary files, UTF-16), or mostly bytes that are not UTF-8."""
    with path.open("rb") as handle:
        block = handle.read(BLOCK_BYTES)
        at_end = not handle.read(1)
    if block.startswith(_UTF16_BOMS):
        raise NotTextError(f"{path} is UTF-16 text; save it as UTF-8")
    if b"\x00" in block:
        raise NotTextError(f"{path} is not a text file (it holds NUL bytes)")
    undecodable = _count_undecodable(block, at_end)
    if block and undecodable / len(block) > MAX_UNDECODABLE_SHARE:
        raise NotTextError(f"{path} is not a UTF-8 text file ({undecodable} of its first {len(block)} bytes "
                           f"are not UTF-8)")


def _count_undecodable(block: bytes, at_end: bool) -> int:
    """Bytes of the block that are not part of valid UTF-8 (a character cut by the block's
    end counts as valid unless the file ends there)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    text = decoder.decode(block, final=at_end)
    held_back, _ = decoder.getstate()  # the start of a character the block's end cut
    # Undecodable bytes became lone surrogates, which encoding with "ignore" drops again.
    return len(block) - len(held_back) - len(text.encode("utf-8", "ignore"))
