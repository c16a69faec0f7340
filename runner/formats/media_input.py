"""Images and audio as requests carry them (OpenAI's image_url and input_audio parts, a batch
line's file path), checked before anything runs and turned into the parts the engine takes:
{"type": "image" | "audio", "data": the file's bytes}.

A medium is read from a data URL (data:image/png;base64,...) or from a file under a folder the
caller allows (batch-run: the prompts file's folder); an http(s) URL is refused, saying why (the
server fetches nothing). What is checked: the size (MAX_MEDIUM_BYTES), the format by its first
bytes (PNG, JPEG, GIF, BMP; WAV, MP3, FLAC; llama.cpp reads WebP through an ffmpeg
process, which a server should not start for a client), and an image's width and height from its
header against MAX_IMAGE_PIXELS, so that a small file that would decompress into gigabytes
(a decompression bomb) is refused before it is decoded. Each problem is an ItemError naming the
part.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..llama.media import MEDIA_MARKER
from .item_error import ItemError

MAX_MEDIUM_BYTES = 20 * 2**20  # one image's or audio's file
MAX_MEDIA_PER_REQUEST = 32
MAX_IMAGE_PIXELS = 40_000_000  # width x height: a 6,000 x 6,000 photograph fits, a bomb does not


def openai_media_part(part: dict[str, Any], where: str, media_root: Path | None = None) -> dict[str, Any]:
    """An OpenAI content part that is a medium: image_url ({"url"} or the URL itself) or
    input_audio ({"data": base64, "format"}), as {"type", "data"}."""
    kind = part.get("type")
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
        if not isinstance(url, str) or not url:
            raise ItemError(f"{where}.image_url must be an object with a 'url' string", f"{where}.image_url")
        return {"type": "image", "data": image_bytes(url, f"{where}.image_url.url", media_root)}
    if kind == "input_audio":
        value = part.get("input_audio")
        data = value.get("data") if isinstance(value, dict) else None
        if not isinstance(data, str) or not data:
            raise ItemError(f"{where}.input_audio must be an object with base64 'data' and a 'format'",
                            f"{where}.input_audio")
        return {"type": "audio", "data": checked(_base64(data, f"{where}.input_audio.data"),
                                                 f"{where}.input_audio.data", "audio")}
    raise ItemError(f"{where} is a {kind!r} part, which cannot be honoured: the parts are text, image_url and "
                    f"input_audio", f"{where}.type")


LLAMA_SERVER_MARKER = "<__media__>"  # where llama-server's /completion prompt places a medium (mtmd's default)


@dataclass(frozen=True)
class PromptWithMedia:
    """A prompt string placing media (multiseq.MEDIA_MARKER), and the media in order."""

    text: str
    media: tuple[bytes, ...]


def media_prompt(value: dict[str, Any], where: str) -> PromptWithMedia:
    """llama-server's multimodal prompt: {"prompt_string" with a <__media__> marker per medium,
    "multimodal_data": [base64, ...]}."""
    text, data = value.get("prompt_string"), value.get("multimodal_data", [])
    if not isinstance(text, str) or not text.strip():
        raise ItemError(f"'{where}.prompt_string' must be a non-empty string", "prompt")
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data) or len(data) > MAX_MEDIA_PER_REQUEST:
        raise ItemError(f"'{where}.multimodal_data' must be a list of at most {MAX_MEDIA_PER_REQUEST} base64 strings",
                        "prompt")
    if text.count(LLAMA_SERVER_MARKER) != len(data):
        raise ItemError(f"'{where}.prompt_string' places {text.count(LLAMA_SERVER_MARKER)} media ({LLAMA_SERVER_MARKER}), "
                        f"and {len(data)} are given", "prompt")
    media = []
    for index, item in enumerate(data):
        part = f"{where}.multimodal_data[{index}]"
        medium = _base64(item, part)
        media.append(checked(medium, part, "audio" if sniff(medium)[0] == "audio" else "image"))
    return PromptWithMedia(text.replace(LLAMA_SERVER_MARKER, MEDIA_MARKER), tuple(media))


def image_bytes(url: str, where: str, media_root: Path | None = None) -> bytes:
    """An image's bytes from its URL (medium_bytes), checked as an image (checked)."""
    return checked(medium_bytes(url, where, media_root), where, "image")


def medium_bytes(url: str, where: str, media_root: Path | None = None) -> bytes:
    """A medium's bytes from a data URL, or from a file under media_root (a path relative to it,
    or a file:// URL); an http(s) URL is refused."""
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ItemError(f"{where} must be a base64 data URL (data:image/png;base64,...)", where)
        return _base64(payload, where)
    if url.startswith(("http://", "https://")):
        raise ItemError(f"{where} is an http(s) URL, and this server fetches nothing: send the image itself, as a "
                        f"data URL (data:image/png;base64,...)", where)
    if media_root is None:
        raise ItemError(f"{where} must be a data URL (data:image/png;base64,...): files are read only by batch-run, "
                        f"from the prompts file's folder", where)
    return _file_bytes(url.removeprefix("file://"), where, media_root)


def _file_bytes(name: str, where: str, root: Path) -> bytes:
    root = root.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ItemError(f"{where}: {name!r} is outside the folder media are read from ({root})", where)
    try:
        if path.stat().st_size > MAX_MEDIUM_BYTES:
            raise ItemError(f"{where}: {name!r} has more than {MAX_MEDIUM_BYTES} bytes", where)
        return path.read_bytes()
    except OSError as error:
        raise ItemError(f"{where}: cannot read {name!r} ({error.strerror or error})", where) from None


def _base64(text: str, where: str) -> bytes:
    if len(text) > MAX_MEDIUM_BYTES * 4 // 3 + 4:
        raise ItemError(f"{where} holds more than {MAX_MEDIUM_BYTES} bytes", where)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ItemError(f"{where} is not valid base64", where) from None


def checked(data: bytes, where: str, expected: str) -> bytes:
    """The medium, once its size, format and (for an image) pixels are within bounds."""
    if not data:
        raise ItemError(f"{where} is empty", where)
    if len(data) > MAX_MEDIUM_BYTES:
        raise ItemError(f"{where} has {len(data)} bytes; at most {MAX_MEDIUM_BYTES} are taken", where)
    kind, size = sniff(data)
    if kind is None:
        raise ItemError(f"{where} is not an image or audio in a format multiseq reads (PNG, JPEG, GIF, BMP; "
                        f"WAV, MP3, FLAC)", where)
    if kind != expected:
        raise ItemError(f"{where} holds {kind}, where {expected} was expected", where)
    if size is not None:
        width, height = size
        if width <= 0 or height <= 0:
            raise ItemError(f"{where} is an image of {width} x {height} pixels", where)
        if width * height > MAX_IMAGE_PIXELS:
            raise ItemError(f"{where} is an image of {width} x {height} pixels; at most {MAX_IMAGE_PIXELS} pixels are "
                            f"taken", where)
    return data


def sniff(data: bytes) -> tuple[str | None, tuple[int, int] | None]:
    """("image", (width, height)) or ("audio", None) by the file's first bytes; (None, None)
    for a format not read. An image whose header is cut short has no size: (image, (0, 0))."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image", struct.unpack(">II", data[16:24]) if len(data) >= 24 else (0, 0)
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image", struct.unpack("<HH", data[6:10]) if len(data) >= 10 else (0, 0)
    if data.startswith(b"BM"):
        return "image", _bmp_size(data)
    if data.startswith(b"\xff\xd8"):
        return "image", _jpeg_size(data)
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE" or data.startswith((b"ID3", b"fLaC")) or \
            data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio", None
    return None, None


def _bmp_size(data: bytes) -> tuple[int, int]:
    if len(data) < 26:
        return 0, 0
    width, height = struct.unpack("<ii", data[18:26])
    return abs(width), abs(height)


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The frame's size from the first start-of-frame marker (SOF0-SOF15 but DHT, JPG, DAC)."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return 0, 0
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if at + 9 > len(data):
                return 0, 0
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return width, height
        at += 2 + length
    return 0, 0
